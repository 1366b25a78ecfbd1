// The modules of diffusers' AutoencoderKLWan on a CUDA device (internal), the counterparts of
// wan_vae_blocks.h's CPU modules over device feature maps: the causal 3-D convolution with its
// feature cache, the residual block, the mid block's attention, the decoder's upsamplers and the
// encoder's downsamplers. Weights are
// uploaded once, when a module is built; forward() only enqueues work on the decode's stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/cudnn_conv.h"
#include "cuda/device_buffers.h"
#include "tessel/core/device.h"
#include "tessel/core/tensor.h"
#include "wan_vae_blocks.h"

namespace tessel::vae::cuda {

// A feature map on the device: (channels, frames, height, width) fp32, contiguous.
struct DeviceFrames {
  DeviceBuffer buffer;
  int64_t channels = 0, frames = 0, height = 0, width = 0;
  float* data() const { return buffer.data(); }
  int64_t plane() const { return height * width; }
};

class DeviceRowSplit;

// What one decode's modules share: cuDNN, the buffer pool, the stream, whether convolutions may use
// TF32, and the decode's split by height over a group (null: whole frames; vae_row_split.h).
struct DecodeContext {
  CudnnConvolutions& convolutions;
  DeviceBufferPool& buffers;
  cudaStream_t stream;
  bool tf32;
  const DeviceRowSplit* split = nullptr;
  DeviceFrames frames(int64_t channels, int64_t count, int64_t height, int64_t width) const;
};

// The frames a causal convolution saw last (at most kt - 1, oldest first) — diffusers' feat_cache
// entry — and, for a temporal upsampler, whether it has skipped its first chunk.
struct DeviceHistory {
  DeviceFrames frames;
  bool started = false;
};
using DeviceCache = std::vector<DeviceHistory>;

// Device copies of the fp32 weights of one module, by diffusers' name.
Tensor upload(const WeightMap& weights, const std::string& name, Device device);

// WanCausalConv3d (and the plain 1x1x1 and per-frame 3x3 convolutions, kt = 1): output frame j
// reads the kt - 1 frames before it from the history of earlier chunks (zeros before the first).
// Under a split by height a kernel of 3 rows reads the band's halo rows (remembered with the frames).
class DeviceConv {
 public:
  DeviceConv() = default;
  DeviceConv(const WeightMap& weights, const std::string& name, int64_t kt, int64_t kh, int64_t kw, SlotCounter& slots,
             Device device);
  // conv(x) + bias (+ residual, a map of the output's shape, when non-null).
  DeviceFrames forward(const DecodeContext& dc, const DeviceFrames& x, DeviceCache& cache, const float* residual = nullptr) const;
  // conv(x) + bias with no padding at all (the caller laid it out) and the given strides in time
  // and in space; no history is read or kept.
  DeviceFrames forward_valid(const DecodeContext& dc, const DeviceFrames& x, int64_t time_stride, int64_t space_stride) const;
  int64_t out_channels() const { return out_channels_; }
  int64_t slot() const { return slot_; }

 private:
  Tensor weight_, bias_;
  int64_t in_channels_ = 0, out_channels_ = 0, kt_ = 1, kh_ = 1, kw_ = 1, slot_ = -1;
};

// WanResidualBlock: shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x)))))).
class DeviceResidualBlock {
 public:
  DeviceResidualBlock(const WeightMap& weights, const std::string& prefix, int64_t in_dim, int64_t out_dim, SlotCounter& slots,
                      Device device);
  DeviceFrames forward(const DecodeContext& dc, const DeviceFrames& x, DeviceCache& cache) const;

 private:
  Tensor gamma1_, gamma2_;
  DeviceConv conv1_, conv2_, shortcut_;
  bool has_shortcut_ = false;
};

// WanAttentionBlock: x + proj(attention(qkv(norm(x)))), one head over the pixels of each frame.
// The two products of the attention are 1x1 convolutions too (a matrix product is one): scores
// (keys, queries) = conv(q, filter k) and out (channels, queries) = conv(probabilities, filter v),
// in fp32 without TF32 as PyTorch's fp32 scaled_dot_product_attention computes them.
class DeviceAttentionBlock {
 public:
  DeviceAttentionBlock(const WeightMap& weights, const std::string& prefix, int64_t dim, Device device);
  DeviceFrames forward(const DecodeContext& dc, const DeviceFrames& x) const;

 private:
  DeviceFrames frame_forward(const DecodeContext& dc, const float* frame, int64_t height, int64_t width) const;
  Tensor gamma_;
  DeviceConv qkv_, proj_;
  int64_t dim_ = 0;
};

// WanMidBlock: residual block, attention, residual block; under a split by height the attention runs
// on the whole frames gathered from the bands, and each rank keeps its rows.
class DeviceMidBlock {
 public:
  DeviceMidBlock(const WeightMap& weights, const std::string& prefix, int64_t dim, SlotCounter& slots, Device device);
  DeviceFrames forward(const DecodeContext& dc, const DeviceFrames& x, DeviceCache& cache) const;

 private:
  DeviceResidualBlock first_, second_;
  DeviceAttentionBlock attention_;
};

// WanResample "upsample2d" / "upsample3d": for upsample3d a causal (3, 1, 1) time convolution to
// twice the channels whose halves become two consecutive frames (skipped on the first chunk), then
// nearest upsampling by 2 and a 3x3 convolution per frame.
class DeviceUpsampler {
 public:
  DeviceUpsampler(const WeightMap& weights, const std::string& prefix, bool temporal, SlotCounter& slots, Device device);
  DeviceFrames forward(const DecodeContext& dc, const DeviceFrames& x, DeviceCache& cache) const;

 private:
  DeviceConv spatial_, time_;
  bool temporal_ = false;
};

// WanResample "downsample2d" / "downsample3d": per frame a 3x3 convolution of stride 2 over the frame
// padded with zeros below and to the right, then for downsample3d a (3, 1, 1) time convolution of
// stride 2 over the last frame of the previous chunk and this chunk's frames; the first chunk's
// frames pass through it (diffusers caches them instead), so the first frame stays one frame and
// every later pair of frames becomes one.
class DeviceDownsampler {
 public:
  DeviceDownsampler(const WeightMap& weights, const std::string& prefix, bool temporal, SlotCounter& slots, Device device);
  DeviceFrames forward(const DecodeContext& dc, const DeviceFrames& x, DeviceCache& cache) const;

 private:
  DeviceConv spatial_, time_;
  bool temporal_ = false;
};

}  // namespace tessel::vae::cuda
