// 3-D convolutions of the Wan VAE through cuDNN (internal): fp32 tensors of diffusers' layout,
// input (1, in_channels, frames, height, width), weight (out_channels, in_channels, kt, kh, kw) as
// PyTorch stores it, output (1, out_channels, frames - kt + 1, height, width): no padding in time
// (the caller lays the causal frames before the input), kh / 2 and kw / 2 in space. The encoder's
// downsamplers ask for strides and no spatial padding instead (their zero padding is on the bottom
// and right only, which cuDNN's symmetric padding cannot express: the caller lays it out). No bias:
// the caller adds it (with a residual when there is one) in one pass.
//
// TF32 is allowed or not per convolution. The algorithm for each geometry is chosen once by cuDNN's
// heuristic (what PyTorch does when cudnn.benchmark is off, its default), with the descriptors
// cached, so later chunks of a decode only enqueue.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "cuda/device_buffers.h"

namespace tessel::vae::cuda {

struct ConvGeometry {
  int64_t in_channels = 0, out_channels = 0;
  int64_t kt = 1, kh = 1, kw = 1;
  int64_t frames = 1, height = 1, width = 1;  // of the input, causal frames included
  bool tf32 = true;
  int64_t time_stride = 1, space_stride = 1;
  bool pad_space = true;  // kh / 2 and kw / 2 zeros around each frame; false: none
  // With pad_space, false pads the width only: the caller laid out the rows above and below (a
  // band's halo under a decode split by height).
  bool pad_rows = true;
  auto tie() const {
    return std::tie(in_channels, out_channels, kt, kh, kw, frames, height, width, tf32, time_stride, space_stride, pad_space, pad_rows);
  }
  bool operator<(const ConvGeometry& other) const { return tie() < other.tie(); }
  int64_t row_padding() const { return pad_space && pad_rows ? kh / 2 : 0; }
  int64_t out_frames() const { return (frames - kt) / time_stride + 1; }
  int64_t out_height() const { return (height + row_padding() * 2 - kh) / space_stride + 1; }
  int64_t out_width() const { return (width + (pad_space ? kw / 2 * 2 : 0) - kw) / space_stride + 1; }
};

class CudnnConvolutions {
 public:
  // The most scratch one convolution may use (PyTorch has no limit; faster algorithms that need
  // more than this are passed over).
  static constexpr size_t kMaxWorkspaceBytes = size_t{2} << 30;

  CudnnConvolutions();  // throws Error when cuDNN cannot be opened or initialized
  ~CudnnConvolutions();
  CudnnConvolutions(const CudnnConvolutions&) = delete;
  CudnnConvolutions& operator=(const CudnnConvolutions&) = delete;

  // Enqueues y = conv(x, weight) on `stream`, taking its scratch from `buffers`.
  void forward(const ConvGeometry& geometry, const float* x, const float* weight, float* y, DeviceBufferPool& buffers,
               cudaStream_t stream);

 private:
  struct Plan;
  const Plan& plan_for(const ConvGeometry& geometry);
  void* handle_ = nullptr;  // cudnnHandle_t
  std::map<ConvGeometry, std::unique_ptr<Plan>> plans_;
};

}  // namespace tessel::vae::cuda
