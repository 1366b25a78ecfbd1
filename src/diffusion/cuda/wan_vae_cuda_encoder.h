// The Wan VAE encoder on a CUDA device (internal): WanVae::encode's path for device videos, the
// counterpart of wan_vae_encoder.h's CPU encoder. fp32 storage and arithmetic as diffusers runs
// AutoencoderKLWan, the convolutions through cuDNN with TF32 allowed or not as for the decoder.
// Encodes as diffusers' _encode: the first frame alone, then chunks of four frames, every causal
// convolution (and temporal downsampler) keeping its feature cache between chunks; the work of a
// whole video is enqueued on one stream and waited for once at the end.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/cudnn_conv.h"
#include "cuda/device_buffers.h"
#include "cuda/vae_cuda_blocks.h"
#include "tessel/core/device.h"
#include "tessel/diffusion/wan_vae.h"

namespace tessel::vae::cuda {

class CudaEncoder {
 public:
  // Uploads the encoder's weights (encoder.* and quant_conv's mu half) from `weights` to `device`.
  // Throws Error when cuDNN cannot be opened.
  CudaEncoder(const WanVaeConfig& config, const WeightMap& weights, Device device);
  ~CudaEncoder();

  // video (batch, colours, frames, height, width) and mu (batch, z_dim, latent_frames, height / s,
  // width / s), fp32 contiguous on this encoder's device (shapes checked by the caller, s the VAE's
  // spatial compression). Each video of the batch is encoded on its own. Enqueues on `stream` and
  // waits for it (the buffers are reused by the next encode). `control` as WanVae::encode's: false
  // when cancelled; with an on_chunk callback each chunk is waited for, so the count is what the
  // device finished.
  bool encode(cudaStream_t stream, const float* video, int64_t batch, int64_t frames, int64_t height, int64_t width, float* mu,
              int64_t latent_frames, bool tf32, const WanDecodeControl* control = nullptr) const;

 private:
  struct Stage {
    std::vector<DeviceResidualBlock> resnets;
    std::unique_ptr<DeviceDownsampler> downsampler;
    // Residual down blocks (Wan 2.2): the stage's input, averaged down to the output's size
    // (diffusers' AvgDown3D), is added to the output.
    bool average_shortcut = false;
    int64_t out_dim = 0, time_factor = 1, space_factor = 1;
  };
  // One chunk of patched frames through the encoder and quant_conv's mu half.
  DeviceFrames chunk(const DecodeContext& dc, DeviceFrames x, DeviceCache& cache) const;

  Device device_;
  int64_t z_dim_ = 0, in_channels_ = 0, patch_ = 1, spatial_ = 8, slots_ = 0;
  DeviceConv conv_in_, conv_out_, quant_mu_;
  std::vector<Stage> stages_;
  std::unique_ptr<DeviceMidBlock> mid_;
  Tensor norm_out_;

  // One encode at a time: cuDNN's handle, the plans and the buffers are shared.
  mutable std::mutex mutex_;
  mutable std::unique_ptr<CudnnConvolutions> convolutions_;
  mutable DeviceBufferPool buffers_;
};

}  // namespace tessel::vae::cuda
