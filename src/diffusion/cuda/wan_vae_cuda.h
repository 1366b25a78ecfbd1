// The Wan VAE decoder on a CUDA device (internal): WanVae::decode's path for device tensors. fp32
// storage and arithmetic as diffusers runs AutoencoderKLWan by default, with the convolutions
// allowed TF32 as PyTorch allows cuDNN by default (WanVae::set_cuda_tf32 turns that off); the
// attention's products stay fp32. Decodes one latent frame at a time with the feature cache, as
// diffusers does, so the activations of one chunk bound the memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "cuda/cudnn_conv.h"
#include "cuda/device_buffers.h"
#include "cuda/vae_cuda_blocks.h"
#include "tessel/core/device.h"
#include "tessel/diffusion/wan_vae.h"
#include "tessel/parallel/communicator.h"

namespace tessel::vae::cuda {

class CudaDecoder {
 public:
  // Uploads the decoder's weights (post_quant_conv and decoder.*) from `weights` to `device`.
  // Throws Error when cuDNN cannot be opened.
  CudaDecoder(const WanVaeConfig& config, const WeightMap& weights, Device device);
  ~CudaDecoder();

  // latents (1, z_dim, frames, height, width) and video (WanVae::decoded_shape: 3 colour channels,
  // 4 (frames - 1) + 1 frames of spatial_compression() times the latent height and width), fp32
  // contiguous on this decoder's device (shapes checked by the caller).
  // Enqueues on `stream` and waits for it: the decoder's buffers are reused by the next decode,
  // which may come on another stream. `control` as WanVae::decode's: false when cancelled.
  // `group` (null: whole frames): a communicator of more than one rank on this device, at most
  // `height` ranks, over which the decode is split by height (vae_row_split.h); every rank gets the
  // whole video.
  bool decode(cudaStream_t stream, const float* latents, int64_t frames, int64_t height, int64_t width, float* video,
              int64_t video_frames, bool tf32, const WanDecodeControl* control = nullptr, Communicator* group = nullptr) const;

  Device device() const { return device_; }

 private:
  struct UpStage {
    std::vector<DeviceResidualBlock> resnets;
    std::unique_ptr<DeviceUpsampler> upsampler;
    // Residual up blocks (Wan 2.2): the stage's input, duplicated up to the output's size
    // (out_dim channels, time_factor frames per frame), is added to the output.
    bool duplicate_shortcut = false;
    int64_t out_dim = 0, time_factor = 1;
  };
  Device device_;
  int64_t z_dim_ = 0, slots_ = 0, patch_ = 1;
  Tensor mean_, inverse_std_;
  DeviceConv post_quant_, conv_in_, conv_out_;
  std::unique_ptr<DeviceMidBlock> mid_;
  std::vector<UpStage> stages_;
  Tensor norm_out_;

  // One decode at a time: cuDNN's handle, the plans and the buffers are shared.
  mutable std::mutex mutex_;
  mutable std::unique_ptr<CudnnConvolutions> convolutions_;
  mutable DeviceBufferPool buffers_;
  mutable std::optional<std::pair<int64_t, int64_t>> last_latent_size_;
};

}  // namespace tessel::vae::cuda
