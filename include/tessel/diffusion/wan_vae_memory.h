// What a Wan VAE decode or encode will hold and compute, estimated from the config and the shapes
// before anything is allocated, so that a command can refuse a size it has no memory for (the
// CLI's budgets) instead of failing an allocation after minutes of denoising. The estimate follows
// how the decoder and the encoder allocate (wan_vae.h): one chunk (at most four frames) at a time,
// each causal convolution keeping the last two frames it read; the CUDA decoder's buffers come
// from a pool that keeps every size it made for the next chunk.
#pragma once

#include "tessel/core/device.h"
#include "tessel/core/tensor.h"
#include "tessel/diffusion/wan_vae.h"

namespace tessel {

struct WanVaeCost {
  // The peak of the activations and the feature cache of one call on its device, the weights, the
  // latents and the video excluded.
  double activation_bytes = 0.0;
  // The call's output: the fp32 video of a decode (WanVae::decoded_shape), the fp32 latents of an
  // encode (WanVae::encoded_shape).
  double output_bytes = 0.0;
  // The convolutions' arithmetic (2 x multiply-adds) of the whole call.
  double flop = 0.0;
};

// A decode of latents (1, z_dim, T, h, w) on `device`: the CPU's padded channels-last frames, or the
// CUDA decoder's pooled (channels, frames, height, width) buffers.
WanVaeCost wan_vae_decode_cost(const WanVaeConfig& config, const Shape& latent_shape, Device device);
// An encode (on the CPU) of a video (B, colours, F, H, W), one video of the batch at a time.
WanVaeCost wan_vae_encode_cost(const WanVaeConfig& config, const Shape& video_shape);

// Host bytes of a WanVae built with `parts`: `held` once built (the packed fp32 convolutions, and in
// builds with the CUDA decoder the decoder's fp32 tensors it uploads from), `building` the peak
// while it is built (the weights as read, their fp32 copies and the packed ones at once).
struct WanVaeHostWeights {
  double held = 0.0;
  double building = 0.0;
};
WanVaeHostWeights wan_vae_host_weight_bytes(const WanVaeConfig& config, WanVaeParts parts);
// Device bytes of the CUDA decoder's weights (post_quant_conv and the decoder, fp32).
double wan_vae_device_weight_bytes(const WanVaeConfig& config);

}  // namespace tessel
