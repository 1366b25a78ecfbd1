// The estimate of a generation (generate_estimate.h).
#include "generate_estimate.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "tessel/diffusion/wan_vae.h"
#include "tessel/diffusion/wan_vae_memory.h"

namespace tessel::cli {
namespace {

// Bytes of the text encoder's safetensors files (bf16 for Wan's UMT5-XXL: about 11 GB).
double text_encoder_file_bytes(const WanModelDir& model) {
  double bytes = 0.0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(model.component("text_encoder"), error))
    if (entry.path().extension() == ".safetensors") bytes += static_cast<double>(entry.file_size(error));
  return bytes;
}

}  // namespace

WorkEstimate generate_estimate(const WanModelDir& model, const GenerateShape& shape, const ParallelFlags& parallel, Device device) {
  const bool cuda = device.is_cuda();
  const WanConfig& config = model.transformer;
  const Shape latent = shape.size.latent_shape(config.out_channels);
  const double tokens = static_cast<double>(latent[2] / config.patch_size[0] * (latent[3] / config.patch_size[1]) *
                                            (latent[4] / config.patch_size[2]));
  // This rank's rows: its shard of the tokens, of its guidance branch under CFG-parallel.
  const double branches = shape.guided ? (parallel.cfg_parallel ? 1.0 : 2.0) : 1.0;
  const double batch = branches * static_cast<double>(shape.num_outputs);
  const double rank_tokens = tokens / static_cast<double>(parallel.ulysses * parallel.ring);
  const double rows = batch * rank_tokens;

  const bool fp8 = shape.fp8_weights;
  double transformers = cuda ? wan_cuda_weight_bytes(config, fp8) : wan_cpu_weight_bytes(config);
  if (model.transformer_2)
    transformers += cuda ? wan_cuda_weight_bytes(*model.transformer_2, fp8) : wan_cpu_weight_bytes(*model.transformer_2);
  // The files are bf16: twice that in fp32 on the CPU, as they are on CUDA.
  const double text_encoder = shape.text_encoder && model.has_text_encoder ? (cuda ? 1.0 : 2.0) * text_encoder_file_bytes(model) : 0.0;
  const double activations = cuda ? wan_cuda_activation_bytes(config, rows, fp8, shape.fp8_attention) : wan_cpu_activation_bytes(config, rows);

  // The VAE: its weights on the host (and the decoder's on the device for a CUDA decode), then the
  // decode's activations and the video (fp32, and its 8-bit frames) per output.
  const std::optional<WanVaeConfig> vae = model.has_vae && (shape.decode || shape.encoded_frames > 0) ? wan_model_vae_config(model.path) : std::nullopt;
  WanVaeHostWeights vae_weights;
  WanVaeCost decode, encode;
  double video = 0.0, frames = 0.0;
  if (vae) {
    vae_weights = wan_vae_host_weight_bytes(*vae, shape.encoded_frames > 0 ? WanVaeParts::kDecoderAndEncoder : WanVaeParts::kDecoder);
    if (shape.decode) {
      decode = wan_vae_decode_cost(*vae, latent, device);
      video = decode.output_bytes;
      frames = video / 4.0 * static_cast<double>(shape.num_outputs);  // 8-bit RGB per output
    }
    if (shape.encoded_frames > 0) encode = wan_vae_encode_cost(*vae, {1, 3, shape.encoded_frames, shape.size.height, shape.size.width});
  }

  WorkEstimate e;
  const double loop_host = transformers + text_encoder + activations;
  if (cuda) {
    e.device_bytes = loop_host + (shape.decode && vae ? wan_vae_device_weight_bytes(*vae) + decode.activation_bytes + video : 0.0);
    e.host_bytes = std::max(vae_weights.building, vae_weights.held + video + frames);
  } else {
    // The VAE is built after the transformers and the text encoder; the decode runs after the loop
    // (the loop's activations are gone), the image condition's encode before it.
    const double weights = transformers + text_encoder;
    e.host_bytes = std::max({weights + vae_weights.building,
                             weights + vae_weights.held + std::max({activations, encode.activation_bytes + video,
                                                                    decode.activation_bytes + video + frames})});
  }
  // Wan's text encoder pads the prompt to 512 tokens; the ranks share a forward's arithmetic.
  const double forward = wan_forward_flop(config, batch, tokens, 512.0) / static_cast<double>(parallel.ulysses * parallel.ring);
  e.flop = static_cast<double>(shape.steps) * forward + static_cast<double>(shape.num_outputs) * decode.flop + encode.flop;
  return e;
}

}  // namespace tessel::cli
