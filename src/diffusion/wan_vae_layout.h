// The stages of the Wan VAE's encoder and decoder as diffusers builds them from the config: their
// channel counts and which ones resample in space and time.
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/diffusion/wan_vae.h"

namespace tessel::vae {

// Frames per latent frame (after the first) and pixels per latent pixel.
int64_t temporal_factor(const WanVaeConfig& config);
int64_t spatial_factor(const WanVaeConfig& config);

// One decoder up block: num_res_blocks + 1 residual blocks in_dim -> out_dim, then (but for the
// last stage) an upsampler that doubles height and width (and the frame count when `temporal`)
// and halves the channels.
struct DecoderStage {
  int64_t in_dim = 0, out_dim = 0;
  bool upsample = false, temporal = false;
};
std::vector<DecoderStage> decoder_stages(const WanVaeConfig& config);

// One encoder stage: num_res_blocks residual blocks in_dim -> out_dim, then (but for the last
// stage) a downsampler that halves height and width (and the frame count when `temporal`).
struct EncoderStage {
  int64_t in_dim = 0, out_dim = 0;
  bool downsample = false, temporal = false;
};
std::vector<EncoderStage> encoder_stages(const WanVaeConfig& config);

}  // namespace tessel::vae
