// The Wan video VAE, as diffusers' AutoencoderKLWan (Wan 2.1 layout) computes it, fp32 on the CPU.
//
// Decoding runs the way diffusers runs it: post_quant_conv over all latent frames, then the decoder
// one latent frame at a time. Every causal 3-D convolution keeps the last two frames it was given
// (the feature cache) and prepends them to the next frame, so decoding frame by frame equals a
// causal convolution over the whole video; each temporal upsampler skips its time convolution on
// the first frame. The first latent frame becomes one video frame and every later one four, so
// T latent frames give 4 (T - 1) + 1 frames of 8x the latent height and width, clamped to [-1, 1].
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/dit/checkpoint.h"

namespace tessel {

// diffusers' AutoencoderKLWan config (vae/config.json). Wan 2.2's residual VAE (is_residual,
// patch_size) and attention inside the down/up blocks (attn_scales) are rejected by the parser.
struct WanVaeConfig {
  int64_t base_dim = 96;
  int64_t decoder_base_dim = 96;  // base_dim when the config has null
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  // Per stage but the last: the encoder halves the frame count there; the decoder doubles it in the
  // reverse order.
  std::vector<bool> temporal_downsample = {false, true, true};
  std::vector<float> latents_mean;  // z_dim values each
  std::vector<float> latents_std;
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  // Throws Error naming the field when a value is out of range or the lists disagree in length.
  void validate() const;
};

WanVaeConfig parse_wan_vae_config(std::string_view json_text, const std::string& source = "config.json");

// Every tensor of a diffusers AutoencoderKLWan checkpoint (encoder, quant_conv, post_quant_conv,
// decoder), with diffusers' names and shapes.
std::vector<WeightSpec> wan_vae_weight_specs(const WanVaeConfig& config);

class WanVae {
 public:
  // `weights` holds exactly the tensors of wan_vae_weight_specs(config), any float dtype.
  WanVae(WanVaeConfig config, const std::map<std::string, Tensor>& weights);
  ~WanVae();
  WanVae(WanVae&&) noexcept;
  WanVae& operator=(WanVae&&) noexcept;

  // Reads a diffusers vae/ directory: config.json and diffusion_pytorch_model.safetensors (or its
  // sharded index). Throws Error naming a missing file or tensor, or a tensor of another shape.
  static WanVae load(const std::string& directory);

  // The video shape decoded from latents of `latent_shape` (1, z_dim, T, h, w):
  // (1, out_channels, 4 (T - 1) + 1, 8 h, 8 w) for Wan's three upsampling stages.
  Shape decoded_shape(const Shape& latent_shape) const;

  // latents: (1, z_dim, T, h, w) fp32 CPU contiguous, normalized as the denoising loop produces
  // them; they are de-normalized (latents * latents_std + latents_mean, as WanPipeline does before
  // calling the VAE) and decoded. video: decoded_shape(latents), fp32 CPU contiguous, values in
  // [-1, 1]. Throws Error naming a bad argument before writing anything.
  void decode(const ExecContext& ctx, const TensorView& latents, const TensorView& video) const;
  Tensor decode(const ExecContext& ctx, const TensorView& latents) const;

  const WanVaeConfig& config() const { return config_; }

 private:
  struct Decoder;
  WanVaeConfig config_;
  std::unique_ptr<Decoder> decoder_;
};

}  // namespace tessel
