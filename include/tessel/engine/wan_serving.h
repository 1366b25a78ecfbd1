// The Wan text-to-video model type ("WanPipeline") for the engine: the worker-side runner (the
// library's WanGenerator over the model directory: both experts of Wan 2.2's A14B layout, its
// tokenizer/ and text_encoder/ for prompts, its vae/ when present), the engine-side request checks, and the
// encoding of its outputs.
#pragma once

#include <cstdint>
#include <array>
#include <map>
#include <string>
#include <vector>

#include "tessel/diffusion/cache_backend.h"
#include "tessel/dit/wan_lora.h"
#include "tessel/engine/pipeline_runner.h"
#include "tessel/engine/processing.h"

namespace tessel {
struct WanModelDir;
}

namespace tessel::engine {

struct WanDeadlineModel;  // wan_deadline.h

inline constexpr const char* kWanModelType = "WanPipeline";

// What the app configures once for every worker (sent to them as JSON).
struct WanRunnerConfig {
  // safetensors with prompt_embeds (and negative_prompt_embeds for guidance > 1): the text
  // conditioning of every request, as `tessel generate --embeddings` takes it. Empty: each
  // request's prompt through the model's tokenizer/ and text_encoder/.
  std::string embeddings_file;
  int num_threads = 0;                 // CPU threads (0: the OpenMP default)
  // Where the transformers, the text encoder and the VAE run: "cpu" (fp32) or "cuda[:N]" (bf16
  // transformers, the VAE on the GPU through cuDNN), as `tessel generate --device`.
  std::string device = "cpu";
  std::string sparse_attn_config_json;  // the default setting: a SparseAttnConfig's JSON; empty: dense
  // Wan 2.2's two experts: the low-noise expert's (transformer_2) config JSON of the default
  // setting; empty: the first expert's. A model with one expert refuses it at start.
  std::string sparse_attn_config_2_json;
  // Other settings a request may name in `sparse_attention` (name -> config JSON, empty: dense);
  // each is loaded the first time a request names it (another copy of the transformer's weights).
  std::map<std::string, std::string> sparse_attention_settings;
  std::string backend_override;        // the app's backend override (environment), empty: none
  std::vector<std::string> plugin_dirs;
  std::string scheduler;               // "unipc" or "euler" replaces the model's scheduler; empty: keep
  // The server's step cache (a make_cache_backend name: "none", "teacache" or "dbcache") and its
  // settings; a request may ask for "none" instead.
  std::string cache = "none";
  CacheConfig cache_config;
  double flow_shift = 0.0;             // > 0 replaces the scheduler's shift
  // The parallel layout of the worker group (its product is the number of workers): the Ulysses
  // and Ring degrees of the sequence parallelism and CFG-parallel (the two guidance branches on
  // two ranks). On CUDA, rank r runs on the GPU `device`'s index + r, over NCCL; on the CPU the
  // ranks communicate through shared memory. Rank 0 decodes and answers.
  int ulysses = 1;
  int ring = 1;
  bool cfg_parallel = false;
  int ulysses_head_groups = 1;  // ParallelConfig::ulysses_head_groups (Ulysses alone)
  int ulysses_sm_margin = 0;    // ParallelConfig::ulysses_sm_margin
  // LoRAs merged into every request's transformers at start-up (WanLoadOptions::loras / loras_2).
  std::vector<LoraFile> loras, loras_2;
  bool lora_ignore_unmatched = false;
  // Per-request adapters (WanLoadOptions::lora_adapters): (name, file), named by a request's `lora`.
  std::vector<std::pair<std::string, LoraFile>> lora_adapters;
  // The transformers' blocks in pinned host memory, streamed to the GPU (WanWeightResidency).
  bool offload_blocks = false;
  // The transformers' block linear weights in FP8 with FP8 GEMMs (WanWeightPrecision::kFp8).
  bool fp8_weights = false;
  // The self-attention in FP8 (WanLoadOptions::attention_precision kFp8).
  bool fp8_attention = false;
  // Single-file checkpoints replacing the transformers' weights (WanLoadOptions::transformer_file /
  // transformer_2_file); empty: the directory's.
  std::string transformer_file, transformer_2_file;
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
  int64_t size_multiple = 16;  // 2 x the model's VAE stride (wan_model_vae_spatial_stride): the patch is 2 x 2
  // Settings ("default" or an allowed name) whose mask is laid out on one latent patch grid
  // (frames, height, width in patches: spatial patterns), with the model's patch size and VAE
  // stride to compute a request's grid: a request of another grid is refused naming "size".
  std::map<std::string, std::array<int64_t, 3>> layout_bound_settings;
  std::array<int64_t, 3> patch_size{1, 2, 2};
  int64_t vae_spatial_stride = 8;
  size_t max_prompt_bytes = 4096;
  double max_guidance = 50.0;
  bool two_experts = false;  // the model has transformer_2: requests may set guidance_scale_2
  std::vector<std::string> sparse_attention_settings;  // names allowed besides "default"
  std::string cache = "none";  // the server's step cache: a request may name it or "none"
  std::vector<std::string> lora_adapters;  // the names a request's `lora` may take (empty: none)
  // Image to video, from the model's task: whether a video request may or must bring a first frame
  // (the API's input_reference) and a last frame (last_frame). Text to video: neither.
  bool takes_image = false, requires_image = false;
  bool takes_last_image = false, requires_last_image = false;
};
// The image-to-video fields of the limits for a model directory: t2v none; ti2v an optional first
// frame; i2v a first frame, and a last frame as its transformer takes one (Wan 2.1 FLF2V: required;
// Wan 2.1 I2V: none; Wan 2.2 I2V-A14B, no image branch: optional).
void set_image_limits(WanRequestLimits& limits, const WanModelDir& model);

void register_wan_runner(RunnerRegistry& runners);
// Pre-processing: size (multiples of 16 within the limits), frames (4k + 1; 1 for an image),
// steps, n, guidance, prompt length, the reference images the model takes, the LoRA adapter's name; each refusal an Error starting with
// the request field's name.
// Post-processing: with a vae/ the worker decodes each output to 8-bit frames and they become a PNG
// per image or one MP4 per video (a safetensors of the frames when the build has no libav);
// without one, each output's latents become a safetensors file whose tensor is "output_0".
// Deadline: wan_request_deadline_seconds of `deadline` (wan_deadline.h), for the engine's automatic
// request timeout.
void register_wan_processors(ProcessorRegistry& processors, const WanRequestLimits& limits, const WanDeadlineModel& deadline);

}  // namespace tessel::engine
