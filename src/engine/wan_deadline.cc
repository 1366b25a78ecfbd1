#include "tessel/engine/wan_deadline.h"

#include <algorithm>
#include <cmath>

#include "tessel/core/parallel.h"
#include "tessel/diffusion/umt5_tokenizer.h"
#include "tessel/diffusion/wan_generator.h"
#include "tessel/diffusion/wan_pipeline.h"
#include "tessel/diffusion/wan_vae_memory.h"
#include "tessel/dit/wan_flop.h"

namespace tessel::engine {

WanDeadlineModel wan_deadline_model(const WanModelDir& model, const WanRunnerConfig& runner, int max_batch) {
  WanDeadlineModel m;
  m.transformer = model.transformer;
  m.transformer_2 = model.transformer_2;
  if (model.has_vae) m.vae = wan_model_vae_config(model.path);
  if (runner.embeddings_file.empty() && model.has_text_encoder) m.text_encoder = load_umt5_config(model.component("text_encoder"));
  m.vae_spatial_stride = model.vae_spatial_stride;
  m.device = parse_device(runner.device);
  m.sequence_ranks = std::max(1, runner.ulysses * runner.ring);
  m.cfg_parallel = runner.cfg_parallel;
  const int ranks = m.sequence_ranks * (m.cfg_parallel ? 2 : 1);
  // The OpenMP default spreads each worker over every core, which the group's ranks then share.
  m.threads = runner.num_threads > 0 ? runner.num_threads : std::max(1, max_threads() / ranks);
  m.max_batch = std::max(1, max_batch);
  return m;
}

double wan_request_work_seconds(const WanDeadlineModel& model, const GenerationRequest& request) {
  const double cpu_rate = kWanDeadlineCpuFlopPerThread * static_cast<double>(model.threads);
  const double device_rate = model.device.is_cuda() ? kWanDeadlineCudaFlop : cpu_rate;
  // Either expert's guidance runs both branches (Wan 2.2's low-noise expert may guide alone).
  const bool guided = request.guidance_scale > 1.0 || request.guidance_scale_2 > 1.0;
  const double outputs = static_cast<double>(request.num_outputs);

  WanVideoSize size{request.frames, request.height, request.width, model.vae_spatial_stride};
  const Shape latent = size.latent_shape(model.transformer.out_channels);
  const auto& patch = model.transformer.patch_size;
  const double tokens = static_cast<double>(latent[2] / patch[0] * (latent[3] / patch[1]) * (latent[4] / patch[2]));
  // One rank's forward: its guidance branches (one under CFG-parallel) of every output, its share
  // of the tokens; the text is padded to the tokenizer's length.
  const double rows = (guided && !model.cfg_parallel ? 2.0 : 1.0) * outputs;
  const double text = static_cast<double>(kWanMaxSequenceLength);
  double forward = wan_forward_flop(model.transformer, rows, tokens, text);
  if (model.transformer_2) forward = std::max(forward, wan_forward_flop(*model.transformer_2, rows, tokens, text));
  double device_flop = static_cast<double>(request.num_inference_steps) * forward / static_cast<double>(model.sequence_ranks);
  // The prompt, and the negative prompt under guidance.
  if (model.text_encoder) device_flop += umt5_encoder_flop(*model.text_encoder, guided ? 2.0 : 1.0, text);
  double cpu_flop = 0.0;
  if (model.vae) {
    device_flop += outputs * wan_vae_decode_cost(*model.vae, latent, model.device).flop;
    // An image condition is encoded as a video of the request's frames (the image, then zeros).
    if (request.image || request.last_image)
      cpu_flop += wan_vae_encode_cost(*model.vae, {1, 3, request.frames, request.height, request.width}).flop;
  }
  return device_flop / device_rate + cpu_flop / cpu_rate;
}

double wan_request_deadline_seconds(const WanDeadlineModel& model, const GenerationRequest& request) {
  const double work = wan_request_work_seconds(model, request);
  return std::ceil(kWanDeadlineFloorSeconds + kWanDeadlineSafetyFactor * static_cast<double>(model.max_batch) * work);
}

}  // namespace tessel::engine
