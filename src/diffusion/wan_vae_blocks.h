// The modules of diffusers' AutoencoderKLWan over FeatureFrames: the causal 3-D convolution with its
// feature cache, the residual block, the mid block's single-head spatial attention and the
// upsamplers. Each reads its weights by diffusers' names from a map of fp32 tensors whose names and
// shapes the caller has checked.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "wan_vae_ops.h"

namespace tessel::vae {

using WeightMap = std::map<std::string, Tensor>;

// The frames a causal convolution saw last (at most kt - 1, oldest first): diffusers' feat_cache
// entry of one convolution. `started` marks a temporal upsampler that has skipped its first chunk.
struct ConvHistory {
  std::vector<std::vector<float>> frames;
  bool started = false;
};

class RowSplit;

// The feature cache of one decode (or encode): a history per causal convolution, by slot, and the
// decode's split by height over a group (null: whole frames), which every module of the chunk reads.
class FeatureCache {
 public:
  explicit FeatureCache(int64_t slots, const RowSplit* split = nullptr) : histories_(static_cast<size_t>(slots)), split_(split) {}
  ConvHistory& slot(int64_t index) { return histories_.at(static_cast<size_t>(index)); }
  const RowSplit* split() const { return split_; }

 private:
  std::vector<ConvHistory> histories_;
  const RowSplit* split_ = nullptr;
};

// Hands out one cache slot per causal convolution while a model is built.
struct SlotCounter {
  int64_t next = 0;
  int64_t take() { return next++; }
};

// WanCausalConv3d: spatial padding kh / 2, kw / 2; in time each output frame reads the kt - 1 frames
// before it, from the history of earlier chunks and then zeros, so chunk after chunk equals one
// causal convolution over the whole video. A kernel of one frame keeps no history. Under a split by
// height (FeatureCache::split) a kernel of 3 rows reads the band's halo rows, remembered with the
// frames.
class CausalConv {
 public:
  CausalConv() = default;
  CausalConv(const WeightMap& weights, const std::string& name, int64_t kt, int64_t kh, int64_t kw, SlotCounter& slots);
  FeatureFrames forward(const ExecContext& ctx, const FeatureFrames& x, FeatureCache& cache) const;
  int64_t out_channels() const { return conv_.out_channels; }

 private:
  PackedConv conv_;
  int64_t slot_ = -1;
};

// WanResidualBlock: shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x)))))), the shortcut a 1x1x1
// convolution when the channel count changes.
class ResidualBlock {
 public:
  ResidualBlock(const WeightMap& weights, const std::string& prefix, int64_t in_dim, int64_t out_dim, SlotCounter& slots);
  FeatureFrames forward(const ExecContext& ctx, const FeatureFrames& x, FeatureCache& cache) const;

 private:
  std::vector<float> gamma1_, gamma2_;
  CausalConv conv1_, conv2_, shortcut_;
  bool has_shortcut_ = false;
};

// WanAttentionBlock: x + proj(attention(qkv(norm(x)))), one head over the pixels of each frame.
class AttentionBlock {
 public:
  AttentionBlock(const WeightMap& weights, const std::string& prefix, int64_t dim);
  void forward(const ExecContext& ctx, FeatureFrames& x) const;

 private:
  std::vector<float> gamma_;
  PackedConv qkv_, proj_;
};

// WanMidBlock: residual block, attention, residual block. Under a split by height the attention runs
// on the whole frames gathered from the bands, and each rank keeps its rows.
class MidBlock {
 public:
  MidBlock(const WeightMap& weights, const std::string& prefix, int64_t dim, SlotCounter& slots);
  FeatureFrames forward(const ExecContext& ctx, const FeatureFrames& x, FeatureCache& cache) const;

 private:
  ResidualBlock first_, second_;
  AttentionBlock attention_;
};

// WanResample "upsample2d" / "upsample3d": for upsample3d first a (3, 1, 1) causal time convolution
// to twice the channels whose halves become two consecutive frames (skipped on the first chunk, as
// diffusers' "Rep" cache marker does), then per frame nearest upsampling by 2 and a 3x3 convolution
// to dim / 2 channels.
class Upsampler {
 public:
  Upsampler(const WeightMap& weights, const std::string& prefix, int64_t dim, bool temporal, SlotCounter& slots);
  FeatureFrames forward(const ExecContext& ctx, const FeatureFrames& x, FeatureCache& cache) const;

 private:
  FeatureFrames double_frames(const ExecContext& ctx, const FeatureFrames& x, ConvHistory& history) const;
  PackedConv spatial_;
  PackedConv time_even_, time_odd_;  // the two halves of time_conv's output channels
  bool temporal_ = false;
  int64_t slot_ = -1;
};

// WanResample "downsample2d" / "downsample3d": per frame a 3x3 convolution of stride 2 (zero padding
// below and to the right), then for downsample3d a (3, 1, 1) time convolution of stride 2 over the
// last frame of the previous chunk and this chunk's frames. The first chunk skips it, its frames
// passing through (diffusers caches them instead), so the first frame stays one frame and every
// later pair of frames becomes one.
class Downsampler {
 public:
  Downsampler(const WeightMap& weights, const std::string& prefix, bool temporal, SlotCounter& slots);
  FeatureFrames forward(const ExecContext& ctx, const FeatureFrames& x, FeatureCache& cache) const;

 private:
  PackedConv spatial_, time_;
  int64_t slot_ = -1;  // temporal only: the last frame the time convolution was given
};

// fp32 data of a weight by name.
const float* weight_data(const WeightMap& weights, const std::string& name);

}  // namespace tessel::vae
