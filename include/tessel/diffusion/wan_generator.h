// The one door to Wan generation: a diffusers model directory opened and checked once
// (WanModelDir), its components loaded once (WanGenerator::load), and requests turned into videos
// or latents, whole (generate) or step by step (begin / step / finish) so that a server can
// interleave requests. `tessel generate`, the serving engine's runner and the Python pipeline class
// adapt this door; none of them assembles a pipeline of its own (docs/architecture.md).
//
// The shape of the step-level door is frozen: the serving (batching), image-to-video and weights
// (LoRA, FP8) work adds fields to WanLoadOptions and WanRequest, not new doors.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/diffusion/cache_backend.h"
#include "tessel/diffusion/scheduler.h"
#include "tessel/diffusion/video_frames.h"
#include "tessel/diffusion/wan_pipeline.h"
#include "tessel/dit/wan_config.h"
#include "tessel/dit/wan_lora.h"
#include "tessel/parallel/parallel_config.h"
#include "tessel/sparse/config.h"

namespace tessel {

class BackendRegistry;

enum class WanTask {
  kTextToVideo,       // WanPipeline (Wan 2.1 T2V, Wan 2.2 T2V-A14B)
  kTextImageToVideo,  // WanPipeline with expand_timesteps (Wan 2.2 TI2V-5B): text to video runs
  kImageToVideo,      // WanImageToVideoPipeline (Wan 2.1 I2V, Wan 2.2 I2V-A14B)
};
std::string_view wan_task_name(WanTask task);  // "t2v", "ti2v", "i2v"

// What a diffusers Wan model directory holds, read and validated once: model_index.json (class,
// experts and boundary_ratio, expand_timesteps), every present component's config, and which
// optional components exist. Throws Error naming the file and field that is wrong.
struct WanModelDir {
  std::string path;
  WanTask task = WanTask::kTextToVideo;
  bool two_experts = false;
  double boundary_ratio = 0.0;  // two experts only
  WanConfig transformer;
  std::optional<WanConfig> transformer_2;
  SchedulerConfig scheduler;
  int64_t vae_spatial_stride = 8;  // 8 (Wan 2.1's VAE), 16 (Wan 2.2's patched one); 8 without a vae/
  bool has_vae = false;
  bool has_text_encoder = false;  // tokenizer/ and text_encoder/ both present
  bool has_image_encoder = false;  // image_encoder/ (Wan 2.1 I2V's CLIP ViT-H/14; required by an image branch)

  static WanModelDir open(const std::string& dir);
  std::string component(const char* name) const;  // path/name

 private:
  static WanModelDir open_checked(const std::string& dir);  // open's work; filesystem errors escape it
};

// A sparse-attention setting: each expert's config (unset: dense). With one expert the second is
// ignored; with two, an unset second takes the first's.
struct WanSparseSetting {
  std::optional<SparseAttnConfig> config;
  std::optional<SparseAttnConfig> config_2;
};

struct WanLoadOptions {
  Device device = Device::cpu();  // the transformers and the text encoder; cuda[:N] runs bf16
  WanSparseSetting sparse;        // the default setting
  // More settings a request may name (WanRequest::sparse_setting); each is loaded the first time a
  // request names it (another copy of the transformers' weights).
  std::map<std::string, WanSparseSetting> named_sparse;
  // Spatial patterns without a spatial_layout of their own are laid out on this size's latent grid
  // (requests of another grid are then the caller's to refuse). Unset: left as configured.
  std::optional<WanVideoSize> layout_size;
  BackendRegistry* registry = nullptr;  // for sparse settings; not owned, outlives the generator
  std::string backend_override;         // the application's backend override (its environment)
  std::string scheduler;                // "unipc" or "euler" replaces the model's scheduler; empty: keep
  double flow_shift = 0.0;              // > 0 replaces the scheduler's shift
  std::string cache = "none";           // make_cache_backend's name: none, teacache, dbcache
  CacheConfig cache_config;
  // Sequence parallelism and CFG-parallel (not owned; outlive the generator). Null: one process.
  const ParallelGroups* parallel = nullptr;
  // With `parallel`: the ranks of each sequence group share the VAE decode, each a band of the rows
  // (WanVae::decode's group; every rank loads the VAE and gets the whole video; each CFG branch's
  // group decodes the same video). false: each rank that loaded the VAE decodes whole frames alone.
  bool split_decode = true;
  // LoRA adapters and weight diffs merged into the transformers' weights at load (WanLora: the
  // formats and the merge). `loras` change `transformer` (Wan 2.2's high-noise expert), `loras_2`
  // the low-noise `transformer_2` (as diffusers' load_into_transformer_2; Wan 2.2's distilled LoRAs
  // come as one file per expert). Unmatched keys are an Error unless lora_ignore_unmatched.
  std::vector<LoraFile> loras, loras_2;
  bool lora_ignore_unmatched = false;
  // Per-request LoRA adapters (WanLoraBank): (name, file) pairs kept resident and unmerged beside
  // `transformer`; a request names one in WanRequest::lora. Low-rank pairs only (a full diff is an
  // Error naming its file and key: merge it through `loras`). One-expert models only.
  std::vector<std::pair<std::string, LoraFile>> lora_adapters;
  // Where the transformers' blocks live on a CUDA device: all on it, or streamed from pinned host
  // memory two blocks at a time (WanWeightResidency: small cards; bit-equal results).
  WanWeightResidency residency = WanWeightResidency::kDevice;
  // The transformers' block linear weights in bf16 or quantised to FP8 with FP8 GEMMs
  // (WanWeightPrecision; CUDA only).
  WanWeightPrecision precision = WanWeightPrecision::kBf16;
  // What the transformers' self-attention computes in (WanAttentionOptions::precision: kFp8 on
  // CUDA with dense attention; the transformers refuse the rest, naming it).
  AttentionPrecision attention_precision = AttentionPrecision::kInput;
  // A single-file checkpoint replacing a transformer's weights (its config.json still gives the
  // model): the original Wan names, bf16 / fp32 or FP8 as ComfyUI and LightX2V publish them
  // (WanTransformer::load's weights_file; tessel/dit/wan_transformer_file.h). Empty: the
  // directory's. transformer_2_file is the low-noise expert's (a model with transformer_2).
  std::string transformer_file, transformer_2_file;
  bool load_text_encoder = true;  // false: requests bring embeddings
  bool load_vae = true;           // false: results are latents only (image to video still encodes with it)
};

// One request. Validated by begin(), once, where it becomes a generation.
struct WanRequest {
  // The text: a prompt (through the model's tokenizer and text encoder) or embeddings
  // (1, L, text_dim) fp32 CPU, the negative ones with guidance.
  std::string prompt;
  std::string negative_prompt;  // WanPipeline's default: empty
  Tensor prompt_embeds, negative_prompt_embeds;
  int64_t frames = 81, height = 480, width = 832;  // the VAE stride comes from the model
  // Image-to-video (a WanImageToVideoPipeline directory), 8-bit RGB as read_image gives them: the
  // first frame, and FLF2V's last frame (Wan 2.1 FLF2V, whose image branch takes both, and Wan 2.2
  // I2V-A14B). Resized to the request's size with Lanczos when their size is another (diffusers'
  // VaeImageProcessor); CLIP sees them as given. Empty (count 0) for text-to-video.
  VideoFrames image, last_image;
  int64_t steps = 50;
  double guidance = 5.0;
  std::optional<double> guidance_2;  // two experts: the low-noise expert's (default: guidance)
  uint64_t seed = 0;
  Tensor noise;                // the starting latents (fp32 CPU, latent shape) instead of the seed's
  std::string sparse_setting;  // empty or "default": the load's; else a name of named_sparse
  std::string lora;            // empty: no per-request adapter; else a name of WanLoadOptions::lora_adapters
  std::optional<std::string> cache;  // "none" or the load's cache name; unset: the load's
  bool decode = true;  // false: the result holds the latents only (no VAE decode, as output_type="latent")
  // Read between steps and between the decode's chunks: set, the generation stops (result cancelled).
  const std::atomic<bool>* cancel = nullptr;
  // Progress: each phase as it starts ("text encoding", "image encoding", "denoising", "decoding"), every step, and
  // every latent frame the VAE decoded.
  std::function<void(std::string_view phase)> on_phase;
  std::function<void(const WanStepProgress&)> on_step;
  std::function<void(int64_t chunks_done, int64_t chunks)> on_decode_chunk;
};

struct WanGeneratorResult {
  WanGenerationResult generation;  // latents, frames (with a VAE), experts, cache statistics
  double text_encode_seconds = 0.0;
};

// One request in flight (begin .. finish).
class WanGenerationState {
 public:
  ~WanGenerationState();
  WanGenerationState(const WanGenerationState&) = delete;
  WanGenerationState& operator=(const WanGenerationState&) = delete;
  bool done() const;
  int64_t steps_done() const;
  int64_t total_steps() const;

 private:
  friend class WanGenerator;
  struct Impl;
  explicit WanGenerationState(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class WanGenerator {
 public:
  // Opens `dir` (WanModelDir::open) and loads what requests need: the transformer(s) on
  // options.device with the default sparse setting, the text encoder (unless load_text_encoder is
  // false or the directory has none), the VAE (unless load_vae is false or there is none). Image
  // to video's CLIP features and VAE encode run on the CPU on every device (a CUDA transformer takes
  // them through its predictor). Throws Error naming the option or file: a sparse setting for
  // transformer_2 of a one-expert model, a bad cache or scheduler name.
  static WanGenerator load(const ExecContext& ctx, const std::string& dir, const WanLoadOptions& options);
  // The same from a directory the caller has opened already (its flags checked against it), so
  // model_index.json and the components' configs are read once.
  static WanGenerator load(const ExecContext& ctx, WanModelDir model, const WanLoadOptions& options);
  ~WanGenerator();
  WanGenerator(WanGenerator&&) noexcept;
  WanGenerator& operator=(WanGenerator&&) noexcept;

  const WanModelDir& model() const;
  const WanLoadOptions& options() const;
  // A line per LoRA file merged at load (the expert, the file, its format and the modules it
  // changed), then one per per-request adapter.
  std::vector<std::string> lora_summary() const;
  // The video size of a request (frames, height, width and the model's VAE stride), validated.
  WanVideoSize size_of(const WanRequest& request) const;
  // The transformer (expert 0 or 1) of a sparse setting; loads the setting when it is new.
  const WanTransformer& transformer(const std::string& sparse_setting = "", int expert = 0);

  // Validates the request (an Error naming its field), encodes its text and prepares its latents,
  // scheduler and caches; runs no step.
  std::unique_ptr<WanGenerationState> begin(const ExecContext& ctx, const WanRequest& request);
  // The next denoising step of every state that is not done (states of any size and sparse
  // setting). The states of one setting that can share a forward run as one batch of their rows
  // (WanPipeline::step says which: one shape, no step cache, no CFG-parallel group, the same step
  // when sparse attention reads it); the others run alone. `tessel generate --num-outputs` uses it.
  void step(const ExecContext& ctx, std::span<WanGenerationState* const> states);
  // Decodes (with a VAE, unless cancelled) and returns the result; the state is spent.
  WanGeneratorResult finish(const ExecContext& ctx, WanGenerationState& state);
  // begin, step until done, finish.
  WanGeneratorResult generate(const ExecContext& ctx, const WanRequest& request);
  // Several requests together: begun in order, stepped as one (step batches what can share a
  // forward) until all are done, finished in order (a cancelled one's result says so).
  std::vector<WanGeneratorResult> generate(const ExecContext& ctx, std::span<const WanRequest> requests);

 private:
  struct Impl;
  explicit WanGenerator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessel
