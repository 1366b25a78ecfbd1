// The Wan VAE's encoder half as diffusers' AutoencoderKLWan runs it in _encode: WanEncoder3d (its
// down blocks a flat list of residual blocks and downsamplers for Wan 2.1, WanResidualDownBlock with
// the AvgDown3D shortcut for Wan 2.2's residual layout), then quant_conv.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tessel/diffusion/wan_vae.h"
#include "wan_vae_blocks.h"

namespace tessel::vae {

// diffusers' _encode runs the first frame alone, then chunks of this many frames.
inline constexpr int64_t kEncodeChunkFrames = 4;

class Encoder {
 public:
  // `weights`: fp32 tensors of wan_vae_weight_specs(config) (the encoder's and quant_conv's at least).
  Encoder(const WanVaeConfig& config, const WeightMap& weights);
  ~Encoder();
  int64_t cache_slots() const { return slots_.next; }

  // WanEncoder3d.forward on one chunk of patched frames (in_channels channels; the first frame alone,
  // then four at a time) with the cache of the chunks before it, then the mu half of quant_conv (the
  // posterior's mean, which is its mode): z_dim channels, the chunk's latent frames.
  FeatureFrames chunk(const ExecContext& ctx, const FeatureFrames& frames, FeatureCache& cache) const;

 private:
  struct Stage {
    std::vector<ResidualBlock> resnets;
    std::unique_ptr<Downsampler> downsampler;
    bool average_shortcut = false;
    int64_t out_dim = 0, time_factor = 1, space_factor = 1;
  };
  SlotCounter slots_;
  CausalConv conv_in_, conv_out_;
  std::vector<Stage> stages_;
  std::unique_ptr<MidBlock> mid_;
  std::vector<float> norm_out_;
  PackedConv quant_mu_;  // quant_conv's first z_dim output channels: the log-variance is not needed
};

}  // namespace tessel::vae
