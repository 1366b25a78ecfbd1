// The stages of the Wan VAE's encoder and decoder as diffusers builds them from the config: their
// channel counts and which ones resample in space and time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/diffusion/wan_vae.h"

namespace tessel::vae {

// Frames per latent frame (after the first) and pixels per latent pixel (the patch included).
int64_t temporal_factor(const WanVaeConfig& config);
int64_t spatial_factor(const WanVaeConfig& config);

// One decoder up block: num_res_blocks + 1 residual blocks in_dim -> out_dim, then (but for the
// last stage) an upsampler that doubles height and width (and the frame count when `temporal`)
// and makes upsample_dim channels: half of out_dim in Wan 2.1's layout, out_dim in the residual
// one, where the block also adds its input duplicated up to the output's size (`duplicate_shortcut`,
// diffusers' DupUp3D). `prefix` names the upsampler's module: diffusers' WanUpBlock keeps it in a list
// ("upsamplers.0"), WanResidualUpBlock as one module ("upsampler").
struct DecoderStage {
  int64_t in_dim = 0, out_dim = 0, upsample_dim = 0;
  bool upsample = false, temporal = false, duplicate_shortcut = false;
  const char* upsampler_name = "upsamplers.0";
};
std::vector<DecoderStage> decoder_stages(const WanVaeConfig& config);

// One encoder stage: num_res_blocks residual blocks in_dim -> out_dim, then (but for the last
// stage) a downsampler that halves height and width (and the frame count when `temporal`). The
// residual layout groups them in one down block each (diffusers' WanResidualDownBlock, whose
// AvgDown3D shortcut has no weights); Wan 2.1's is one flat list of modules.
// `resnet_names` and `downsampler_name` are the modules' diffusers names ("encoder.down_blocks.3" in
// the flat list, "encoder.down_blocks.1.resnets.0" and "encoder.down_blocks.1.downsampler" in
// residual blocks); `average_shortcut` marks the residual layout's AvgDown3D.
struct EncoderStage {
  int64_t in_dim = 0, out_dim = 0;
  bool downsample = false, temporal = false, average_shortcut = false;
  std::vector<std::string> resnet_names;
  std::string downsampler_name;
};
std::vector<EncoderStage> encoder_stages(const WanVaeConfig& config);

}  // namespace tessel::vae
