// Synthetic Q/K/V that attend like a video DiT's heads, for judging sparse patterns without a
// model. Tokens sit on a frames × height × width grid (raster order). q and k carry 3-D rotary
// position features (the pairs of each head split between the frame, row and column axes, with
// frequencies below π/ℓ weighted by a Gaussian spectrum), so that the logit of a pair is
//   β · Σ_axis a_axis · K_axis(Δ_axis),   K(Δ) ≈ exp(-Δ² / 2ℓ²),  K(0) = 1,
// plus random content terms of standard deviation ≈ noise · β. Head types:
//   spatial  — same frame (ℓ_f = 0.3), local in rows and columns (ℓ = 2);
//   temporal — the same position to about one patch (ℓ = 1), nearby frames (ℓ_f = 2);
//   sink     — weak spatial locality plus a shared component every query and the keys of frame 0
//              carry (logit bonus 0.6 β on frame-0 keys), so frame 0 draws much of the mass;
//   diffuse  — β small: attention nearly uniform.
// β = peak logit (after the 1/√D scale) = 10 · sharpness (diffuse: 1.5 · sharpness).
// v models latent values: each element has unit variance, split into a per-head channel mean
// shared by all tokens (value_mean), a smooth field over (frame, row, column) made of three
// plane waves of frequency <= 0.5 rad per patch (value_smooth), and white noise (the rest).
// Deterministic for a seed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/tensor.h"
#include "tessel/sparse/planners/token_layout.h"

namespace tessel {

enum class SyntheticHeadType : uint8_t { kSpatial, kTemporal, kSink, kDiffuse };
std::string_view synthetic_head_type_name(SyntheticHeadType type);
SyntheticHeadType parse_synthetic_head_type(std::string_view name);  // throws Error

struct SyntheticVideoOptions {
  TokenGrid grid{9, 16, 16};
  int64_t batch = 1;
  int64_t heads = 12;
  int64_t head_dim = 128;
  double sharpness = 1.0;
  double noise = 0.1;
  double value_mean = 0.3;
  double value_smooth = 0.4;
  uint64_t seed = 0;
  DType dtype = DType::kF32;
  // Empty: the default mix, cycling spatial, temporal, spatial, temporal, sink, diffuse.
  std::vector<SyntheticHeadType> head_types;
};

struct SyntheticQkv {
  Tensor q, k, v;  // (batch, F·H·W, heads, head_dim), CPU, options.dtype
  std::vector<SyntheticHeadType> head_types;
};

// Throws Error on non-positive sizes, an odd head_dim < 6, value shares outside [0, 1] (or summing
// above 1), or head_types of the wrong length.
SyntheticQkv make_synthetic_video_qkv(const SyntheticVideoOptions& options);

}  // namespace tessel
