// The Wan text-to-video model type ("WanPipeline") for the engine: the worker-side runner (a
// WanPipeline over the model directory's transformer/ and scheduler/), the engine-side request
// checks, and the encoding of its outputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/engine/pipeline_runner.h"
#include "tessel/engine/processing.h"

namespace tessel::engine {

inline constexpr const char* kWanModelType = "WanPipeline";

// What the app configures once for every worker (sent to them as JSON).
struct WanRunnerConfig {
  // safetensors with prompt_embeds (and negative_prompt_embeds for guidance > 1): the text
  // conditioning of every request, as `tessel generate --embeddings` takes it.
  std::string embeddings_file;
  int num_threads = 0;                 // CPU threads (0: the OpenMP default)
  std::string sparse_attn_config_json;  // a SparseAttnConfig's JSON; empty: dense attention
  std::string backend_override;        // the app's backend override (environment), empty: none
  std::vector<std::string> plugin_dirs;
  std::string scheduler;               // "unipc" or "euler" replaces the model's scheduler; empty: keep
  double flow_shift = 0.0;             // > 0 replaces the scheduler's shift
};
std::string wan_runner_config_to_json(const WanRunnerConfig& config);
WanRunnerConfig wan_runner_config_from_json(const std::string& json_text);

// The bounds the server accepts per request.
struct WanRequestLimits {
  int64_t max_width = 1280;
  int64_t max_height = 1280;
  int64_t max_frames = 129;
  int64_t max_steps = 100;
  int64_t max_outputs = 4;
  size_t max_prompt_bytes = 4096;
  double max_guidance = 50.0;
};

void register_wan_runner(RunnerRegistry& runners);
// Pre-processing: size (multiples of 16 within the limits), frames (4k + 1; 1 for an image),
// steps, n, guidance, prompt length; each refusal an Error starting with the request field's name.
// Post-processing: the latents of each output (each image, or the video) as one safetensors file
// whose tensor is "output_0" (the model directory's VAE decoder is not run by the engine yet).
void register_wan_processors(ProcessorRegistry& processors, const WanRequestLimits& limits);

}  // namespace tessel::engine
