// The Wan model type of wan_serving.h.
#include "tessel/engine/wan_serving.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "tessel/core/current_device.h"
#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/cache_backend.h"
#include "tessel/diffusion/image_io.h"
#include "tessel/diffusion/scheduler.h"
#include "tessel/diffusion/video_frames.h"
#include "tessel/diffusion/video_io.h"
#include "tessel/diffusion/wan_generator.h"
#include "tessel/diffusion/wan_pipeline.h"
#include "tessel/dit/wan_model.h"
#include "tessel/engine/wan_deadline.h"
#include "tessel/parallel/communicator.h"
#include "tessel/parallel/parallel_config.h"
#include "tessel/plugin/plugin_loader.h"
#include "tessel/sparse/registry.h"

namespace tessel {

NLOHMANN_JSON_SERIALIZE_ENUM(TeaCacheInput, {{TeaCacheInput::kTimeProjection, "time_projection"},
                                             {TeaCacheInput::kTimeEmbedding, "time_embedding"}})
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(CacheConfig, teacache_thresh, teacache_input, teacache_coefficients,
                                                dbcache_first_blocks, dbcache_last_blocks, dbcache_thresh, dbcache_warmup_steps,
                                                dbcache_max_cached_steps, dbcache_max_consecutive_cached_steps)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(LoraFile, path, scale)

}  // namespace tessel

namespace tessel::engine {
namespace {

namespace fs = std::filesystem;

Tensor load_embedding(const SafetensorsFile& file, const std::string& name) {
  if (!file.find(name)) fail_argument("embeddings file", "a safetensors file with a tensor \"" + name + "\"", quoted_excerpt(file.path()));
  Tensor tensor = file.load(name);
  return tensor.dtype() == DType::kF32 ? tensor : tensor.to(DType::kF32);
}

// One request on the runner: its generations (one per output) and its progress reporting.
struct WanJob final : RunnerJob {
  WanJob(const GenerationRequest& r, const RunControl& c)
      : request(r), control(c), started(std::chrono::steady_clock::now()), total(r.num_inference_steps * r.num_outputs) {}

  bool done() const override {
    return std::all_of(states.begin(), states.end(), [](const auto& state) { return state->done(); });
  }

  static ExecContext ctx(int num_threads) {
    ExecContext ctx;
    ctx.num_threads = num_threads;
    return ctx;
  }

  // One status update: a finished step (with its time and the schedule's density), or a phase
  // change or decode chunk (step_finished false: no step is counted).
  void report(int64_t step_done, double step_seconds, bool step_finished, double density) const {
    if (!control.on_progress) return;
    RequestProgress progress;
    progress.phase = phase;
    progress.step_finished = step_finished;
    progress.step = step_done;
    progress.total_steps = total;
    progress.step_seconds = step_seconds;
    progress.elapsed_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    progress.eta_seconds =
        step_done > 0 ? progress.elapsed_seconds / static_cast<double>(step_done) * static_cast<double>(total - step_done) : 0.0;
    progress.attention_density = density;
    control.on_progress(progress);
  }

  const GenerationRequest request;
  const RunControl control;
  const std::chrono::steady_clock::time_point started;
  const int64_t total;  // steps over all outputs
  std::atomic<bool> agreed_cancel{false};  // what every rank of a group agreed (one process: unused by the steps)
  std::string phase;
  int64_t steps_reported = 0;
  std::vector<std::unique_ptr<WanGenerationState>> states;
};

class WanRunner final : public PipelineRunner {
 public:
  explicit WanRunner(const RunnerSetup& setup)
      : config_(wan_runner_config_from_json(setup.config_json)), device_(parse_device(config_.device)) {
    if (device_.is_cuda() && !cuda_available())
      fail_argument("worker device", "a device present (no CUDA GPU found, or tessel built without CUDA)", device_.str());
    join_parallel_group(setup);
    if (!config_.embeddings_file.empty()) {
      const SafetensorsFile embeddings = SafetensorsFile::open(config_.embeddings_file);
      prompt_embeds_ = load_embedding(embeddings, "prompt_embeds");
      if (embeddings.find("negative_prompt_embeds")) negative_embeds_ = load_embedding(embeddings, "negative_prompt_embeds");
    }
    // The library's one door: the same generator `tessel generate` runs (both experts of Wan
    // 2.2's A14B layout, its own cache per expert, the scheduler override).
    WanLoadOptions load;
    load.device = device_;
    if (!config_.sparse_attn_config_json.empty()) load.sparse.config = parse_sparse_attn_json(config_.sparse_attn_config_json);
    if (!config_.sparse_attn_config_2_json.empty()) load.sparse.config_2 = parse_sparse_attn_json(config_.sparse_attn_config_2_json);
    for (const auto& [name, json] : config_.sparse_attention_settings) {
      WanSparseSetting setting;
      if (!json.empty()) setting.config = parse_sparse_attn_json(json);
      load.named_sparse.emplace(name, std::move(setting));
    }
    const bool sparse = load.sparse.config || load.sparse.config_2 ||
                        std::any_of(load.named_sparse.begin(), load.named_sparse.end(),
                                    [](const auto& entry) { return entry.second.config.has_value(); });
    if (sparse) {
      registry_ = make_default_registry();
      registry_->set_plugin_dirs(config_.plugin_dirs);
    }
    load.registry = registry_.get();
    load.backend_override = config_.backend_override;
    load.scheduler = config_.scheduler;
    load.flow_shift = config_.flow_shift;
    load.cache = config_.cache;
    load.cache_config = config_.cache_config;
    load.parallel = groups_ ? &*groups_ : nullptr;
    load.loras = config_.loras;
    load.loras_2 = config_.loras_2;
    load.lora_ignore_unmatched = config_.lora_ignore_unmatched;
    load.lora_adapters = config_.lora_adapters;
    load.residency = config_.offload_blocks ? WanWeightResidency::kOffloadBlocks : WanWeightResidency::kDevice;
    load.precision = config_.fp8_weights ? WanWeightPrecision::kFp8 : WanWeightPrecision::kBf16;
    load.attention_precision = config_.fp8_attention ? AttentionPrecision::kFp8 : AttentionPrecision::kInput;
    load.transformer_file = config_.transformer_file;
    load.transformer_2_file = config_.transformer_2_file;
    load.load_text_encoder = config_.embeddings_file.empty();
    // Every rank loads the VAE: each sequence group shares the decode, a band of rows per rank
    // (WanLoadOptions::split_decode); rank 0's whole video is the output.
    load.load_vae = true;
    generator_.emplace(WanGenerator::load(ExecContext{}, setup.model_dir, load));
  }

  // A request's outputs (OpenAI's `n`, each its own seed) are generations of one shape: begun
  // together, stepped with every other job's in one call of the generator's step (which batches
  // what can share a forward), decoded one after another.
  std::unique_ptr<RunnerJob> begin(const GenerationRequest& request, const RunControl& control) override {
    auto job = std::make_unique<WanJob>(request, control);
    // Every rank stops at the same step: a rank that stopped alone would leave the others waiting
    // in the next step's collectives. The ranks agree before the first step and after each one.
    // One process needs no agreement: its generations read the engine's flag itself.
    job->agreed_cancel = agree_on_cancel(control);
    const std::atomic<bool>* cancel = host_world_ || control.cancel == nullptr ? &job->agreed_cancel : control.cancel;
    const bool guided = request.guidance_scale > 1.0;
    const WanTransformer& transformer = generator_->transformer(setting_name(request));
    const int64_t steps = request.num_inference_steps;
    WanJob& j = *job;
    // The references arrive as the client sent them (PNG or JPEG, checked by the HTTP layer).
    const VideoFrames image = request.image ? decode_image(*request.image, "input_reference") : VideoFrames{};
    const VideoFrames last_image = request.last_image ? decode_image(*request.last_image, "last_frame") : VideoFrames{};
    for (int64_t i = 0; i < request.num_outputs; ++i) {
      WanRequest w;
      if (config_.embeddings_file.empty()) {
        w.prompt = request.prompt;
        w.negative_prompt = request.negative_prompt;
      } else {
        if (guided && !negative_embeds_.defined())
          fail_argument("guidance_scale", "<= 1 (the embeddings file has no negative_prompt_embeds)", request.guidance_scale);
        w.prompt_embeds = prompt_embeds_;
        if (guided) w.negative_prompt_embeds = negative_embeds_;
      }
      w.frames = request.frames;
      w.height = request.height;
      w.width = request.width;
      w.image = image;
      w.last_image = last_image;
      w.steps = steps;
      w.guidance = request.guidance_scale;
      if (request.guidance_scale_2 >= 0.0) w.guidance_2 = request.guidance_scale_2;
      w.seed = request.seed + static_cast<uint64_t>(i);
      w.sparse_setting = setting_name(request);
      if (!request.cache.empty()) w.cache = request.cache;
      w.lora = request.lora;
      w.cancel = cancel;
      w.on_phase = [&j](std::string_view name) {
        j.phase = name;
        j.report(j.steps_reported, 0.0, false, 1.0);
      };
      // Every output's step counts; the ranks agree on a cancel once per step of the job (after
      // its first output's), all in the same order since every rank steps the same states.
      w.on_step = [this, &j, &transformer, steps, first = i == 0](const WanStepProgress& p) {
        j.report(++j.steps_reported, p.step_seconds, true, scheduled_density(transformer, p.step - 1, steps));
        if (first) j.agreed_cancel = agree_on_cancel(j.control);
      };
      // During the decode each rank reads its own cancel flag; the decode's group agrees on it
      // between chunks (WanVae::decode), so every rank stops at the same chunk.
      w.on_decode_chunk = [&j, i](int64_t done, int64_t chunks) {
        const int64_t n = j.request.num_outputs;
        j.phase = n > 1 ? detail::concat("decoding output ", i + 1, " of ", n, ": ", done, "/", chunks)
                        : detail::concat("decoding ", done, "/", chunks);
        j.report(j.steps_reported, 0.0, false, 1.0);
        if (j.control.cancel != nullptr && j.control.cancel->load()) j.agreed_cancel = true;
      };
      j.states.push_back(generator_->begin(j.ctx(config_.num_threads), w));
    }
    return job;
  }

  void step(std::span<RunnerJob* const> jobs) override {
    std::vector<WanGenerationState*> states;
    for (RunnerJob* job : jobs)
      for (const auto& state : static_cast<WanJob&>(*job).states) states.push_back(state.get());
    generator_->step(WanJob::ctx(config_.num_threads), states);
  }

  RunnerOutput finish(RunnerJob& runner_job) override {
    WanJob& job = static_cast<WanJob&>(runner_job);
    RunnerOutput output;
    for (const auto& state : job.states) {
      WanGenerationResult result = generator_->finish(WanJob::ctx(config_.num_threads), *state).generation;
      output.steps_done += result.steps_done;
      if (result.cancelled) {
        output.cancelled = true;
        return output;
      }
      output.outputs.push_back(result.frames.count > 0 ? frames_tensor(result.frames) : std::move(result.latents));
    }
    return output;
  }

 private:
  static std::string setting_name(const GenerationRequest& request) {
    return request.sparse_attention.empty() ? "default" : request.sparse_attention;
  }

  // With more than one worker: the group's communicators (shared memory between the processes; on
  // CUDA a NCCL world bootstrapped over it, each rank on its own GPU) and the parallel groups the
  // transformer and the pipeline use.
  void join_parallel_group(const RunnerSetup& setup) {
    ParallelConfig layout;
    layout.sp_ulysses_degree = config_.ulysses;
    layout.sp_ring_degree = config_.ring;
    layout.cfg_parallel_size = config_.cfg_parallel ? 2 : 1;
    layout.ulysses_head_groups = config_.ulysses_head_groups;
    layout.ulysses_sm_margin = config_.ulysses_sm_margin;
    if (layout.world_size() != setup.world_size)
      fail_argument("number of workers for WanPipeline",
                    detail::concat("ulysses x ring (x 2 with cfg_parallel) = ", layout.world_size()), setup.world_size);
    if (setup.world_size == 1) return;
    if (setup.group_world.empty()) fail_argument("RunnerSetup.group_world", "the group's shared-memory world", "none");
    host_world_ = make_shm_communicator(setup.group_world, setup.rank);
    if (device_.is_cuda()) {
      device_ = Device::cuda(device_.index + setup.rank);
      make_current_device(device_);  // this rank's kernels, streams and NCCL communicator on its GPU
      ExecContext ctx;
      ctx.device = device_;
      device_world_ = make_nccl_communicator(ctx, *host_world_, device_);
      groups_.emplace(initialize_parallel_groups(*device_world_, layout));
    } else {
      groups_.emplace(initialize_parallel_groups(*host_world_, layout));
    }
  }

  // True on every rank when any rank's request was cancelled (its own flag: the engine sets it on
  // all of them, but each sees it at its own time).
  bool agree_on_cancel(const RunControl& control) const {
    const bool mine = control.cancel != nullptr && control.cancel->load();
    if (!host_world_) return mine;
    float votes = mine ? 1.0f : 0.0f;
    host_world_->all_reduce_sum(ExecContext{}, TensorView(&votes, DType::kF32, Device::cpu(), {1}));
    return votes > 0.0f;
  }

  // The decoded video as a tensor of 8-bit RGB frames (frames, height, width, 3): a quarter of
  // the fp32 bytes to send to the engine.
  static Tensor frames_tensor(const VideoFrames& frames) {
    Tensor rgb = Tensor::empty({frames.count, frames.height, frames.width, 3}, DType::kU8);
    std::copy(frames.rgb.begin(), frames.rgb.end(), rgb.data_as<uint8_t>());
    return rgb;
  }

  // The mean over layers of the self-attention density the sparse schedule gives `step` (1 when
  // dense or no backend resolved).
  static double scheduled_density(const WanTransformer& transformer, int64_t step, int64_t steps) {
    const int64_t layers = transformer.config().num_layers;
    double sum = 0.0;
    for (int64_t layer = 0; layer < layers; ++layer) {
      const SparseAttention* attention = transformer.block_attention(layer);
      sum += attention != nullptr && attention->adapter().backend() ? attention->adapter().density_at(StepInfo::at(step, steps, layer))
                                                                     : 1.0;
    }
    return layers > 0 ? sum / static_cast<double>(layers) : 1.0;
  }

  WanRunnerConfig config_;
  Device device_;
  std::unique_ptr<Communicator> host_world_;    // the group's shared-memory world (several workers)
  std::unique_ptr<Communicator> device_world_;  // NCCL over it, on CUDA
  std::optional<ParallelGroups> groups_;
  Tensor prompt_embeds_;
  Tensor negative_embeds_;
  std::unique_ptr<BackendRegistry> registry_;
  std::optional<WanGenerator> generator_;
};

VideoFrames frames_of(const Tensor& rgb, double fps) {
  VideoFrames frames;
  frames.count = rgb.size(0);
  frames.height = rgb.size(1);
  frames.width = rgb.size(2);
  frames.fps = fps;
  frames.rgb.assign(rgb.data_as<uint8_t>(), rgb.data_as<uint8_t>() + rgb.numel());
  frames.validate();
  return frames;
}

// write_mp4 writes files: through a private temporary one.
std::string encode_mp4(const VideoFrames& frames) {
  static std::atomic<uint64_t> counter{0};
  const fs::path path = fs::temp_directory_path() / detail::concat("tessel-", getpid(), "-", counter++, ".mp4");
  write_mp4(path.string(), frames);
  std::string bytes = read_file_bounded(path.string(), uint64_t{1} << 34, "MP4 output");
  fs::remove(path);
  return bytes;
}

void check_at_most(const char* field, int64_t value, int64_t low, int64_t high) {
  if (value < low || value > high) fail_argument(field, detail::concat(low, "..", high), value);
}

void check_images(const GenerationRequest& r, const WanRequestLimits& limits) {
  const auto refuse = [](const char* field, const std::string& expected, bool given) {
    fail_argument(field, expected, given ? "an image" : "none");
  };
  if (r.kind == OutputKind::kImage && (r.image || r.last_image)) refuse(r.image ? "input_reference" : "last_frame", "none for an image request", true);
  if (r.image && !limits.takes_image)
    refuse("input_reference", "none: this model makes video from text only (a t2v model; image to video needs an i2v or ti2v one)", true);
  if (!r.image && limits.requires_image)
    refuse("input_reference", "the video's first frame, a PNG or JPEG image (this is an image-to-video model)", false);
  if (r.last_image && !limits.takes_last_image)
    refuse("last_frame", limits.takes_image ? "none: this model takes a first frame only" : "none: this model takes no image", true);
  if (!r.last_image && limits.requires_last_image)
    refuse("last_frame", "the video's last frame, a PNG or JPEG image (this first-last-frame model takes both)", false);
}

}  // namespace

void set_image_limits(WanRequestLimits& limits, const WanModelDir& model) {
  limits.takes_image = model.task != WanTask::kTextToVideo;
  limits.requires_image = model.task == WanTask::kImageToVideo;
  const WanConfig& t = model.transformer;
  limits.takes_last_image = limits.requires_image && !(t.has_image_branch() && t.pos_embed_seq_len == 0);
  limits.requires_last_image = limits.requires_image && t.pos_embed_seq_len > 0;
}

// The JSON the engine hands the workers: every field by its name, a missing one at its default (the
// step cache's settings too, its rescaling polynomial included, so a server given custom TeaCache
// coefficients passes them on).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(WanRunnerConfig, embeddings_file, num_threads, device, sparse_attn_config_json,
                                                sparse_attn_config_2_json, sparse_attention_settings, backend_override, plugin_dirs, scheduler, cache,
                                                cache_config, flow_shift, ulysses, ring, cfg_parallel, ulysses_head_groups, ulysses_sm_margin,
                                                loras, loras_2, lora_ignore_unmatched, lora_adapters, offload_blocks, fp8_weights, fp8_attention,
                                                transformer_file,
                                                transformer_2_file)

std::string wan_runner_config_to_json(const WanRunnerConfig& c) { return nlohmann::json(c).dump(); }

WanRunnerConfig wan_runner_config_from_json(const std::string& json_text) {
  return nlohmann::json::parse(json_text).get<WanRunnerConfig>();
}

void register_wan_runner(RunnerRegistry& runners) {
  runners.add(kWanModelType, [](const RunnerSetup& setup) { return std::make_unique<WanRunner>(setup); });
}

void register_wan_processors(ProcessorRegistry& processors, const WanRequestLimits& limits, const WanDeadlineModel& deadline) {
  PreProcessor pre = [limits](GenerationRequest& r) {
    if (r.prompt.empty()) fail_argument("prompt", "a non-empty string", "an empty one");
    if (r.prompt.size() > limits.max_prompt_bytes)
      fail_argument("prompt", detail::concat("at most ", limits.max_prompt_bytes, " bytes"), r.prompt.size());
    if (r.negative_prompt.size() > limits.max_prompt_bytes)
      fail_argument("negative_prompt", detail::concat("at most ", limits.max_prompt_bytes, " bytes"), r.negative_prompt.size());
    check_at_most("width", r.width, 16, limits.max_width);
    check_at_most("height", r.height, 16, limits.max_height);
    const std::string multiple = detail::concat("a multiple of ", limits.size_multiple, " (the model's VAE stride x the patch)");
    if (r.width % limits.size_multiple != 0) fail_argument("width", multiple, r.width);
    if (r.height % limits.size_multiple != 0) fail_argument("height", multiple, r.height);
    if (r.kind == OutputKind::kImage && r.frames != 1) fail_argument("frames", "1 for an image", r.frames);
    check_at_most("frames", r.frames, 1, limits.max_frames);
    if ((r.frames - 1) % 4 != 0) fail_argument("frames", "4k + 1 (1, 5, 9, ..., 81, ...)", r.frames);
    check_at_most("num_inference_steps", r.num_inference_steps, 1, limits.max_steps);
    check_at_most("n", r.num_outputs, 1, limits.max_outputs);
    if (!(r.guidance_scale >= 0.0 && r.guidance_scale <= limits.max_guidance))
      fail_argument("guidance_scale", detail::concat("0..", limits.max_guidance), r.guidance_scale);
    if (r.guidance_scale_2 >= 0.0 && !limits.two_experts)
      fail_argument("guidance_scale_2", "absent: the model has one expert (no transformer_2)", r.guidance_scale_2);
    if (r.guidance_scale_2 > limits.max_guidance)
      fail_argument("guidance_scale_2", detail::concat("0..", limits.max_guidance), r.guidance_scale_2);
    if (!(r.fps > 0.0 && r.fps <= 120.0)) fail_argument("fps", "0 < fps <= 120", r.fps);
    check_images(r, limits);
    if (!r.cache.empty() && r.cache != "none" && r.cache != limits.cache)
      fail_argument("cache", "\"none\" or the server's \"" + limits.cache + "\"", quoted_excerpt(r.cache));
    const std::string setting = r.sparse_attention.empty() ? "default" : r.sparse_attention;
    if (const auto bound = limits.layout_bound_settings.find(setting); bound != limits.layout_bound_settings.end()) {
      WanVideoSize size{r.frames, r.height, r.width};
      size.vae_spatial_stride = limits.vae_spatial_stride;
      const Shape latent = size.latent_shape(1);
      const int64_t grid[3] = {latent[2] / limits.patch_size[0], latent[3] / limits.patch_size[1],
                               latent[4] / limits.patch_size[2]};
      const auto& [frames, height, width] = bound->second;
      if (grid[0] != frames || grid[1] != height || grid[2] != width)
        fail_argument("size",
                      detail::concat("a size and frame count of latent patch grid ", frames, " x ", height, " x ", width,
                                     " (the sparse attention setting \"", setting, "\" is laid out on it: the server's default ",
                                     "--size and --frames)"),
                      detail::concat(r.width, "x", r.height, " with ", r.frames, " frames (grid ", grid[0], " x ", grid[1], " x ",
                                     grid[2], ")"));
    }
    if (!r.sparse_attention.empty() && r.sparse_attention != "default" &&
        std::find(limits.sparse_attention_settings.begin(), limits.sparse_attention_settings.end(), r.sparse_attention) ==
            limits.sparse_attention_settings.end()) {
      std::string names = "\"default\"";
      for (const std::string& name : limits.sparse_attention_settings) names += ", \"" + name + "\"";
      fail_argument("sparse_attention", "one of " + names, quoted_excerpt(r.sparse_attention));
    }
    if (!r.lora.empty() && std::find(limits.lora_adapters.begin(), limits.lora_adapters.end(), r.lora) == limits.lora_adapters.end()) {
      std::string names;
      for (const std::string& name : limits.lora_adapters) names += (names.empty() ? "\"" : ", \"") + name + "\"";
      fail_argument("lora", names.empty() ? std::string("absent (the server has no per-request adapters: --lora-adapter)") : "one of " + names,
                    quoted_excerpt(r.lora));
    }
  };
  PostProcessor post = [](const GenerationRequest& r, const std::vector<Tensor>& outputs) {
    std::vector<EncodedMedia> media;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].dtype() != DType::kU8) {  // latents: the model has no vae/
        media.push_back(encode_safetensors({outputs[i]}, {{"content", "latents"},
                                                          {"request", r.id},
                                                          {"seed", std::to_string(r.seed + i)},
                                                          {"steps", std::to_string(r.num_inference_steps)}}));
        continue;
      }
      const VideoFrames frames = frames_of(outputs[i], r.fps);
      if (r.kind == OutputKind::kImage) media.push_back({"image/png", encode_png(frames, 0)});
      else if (mp4_available()) media.push_back({"video/mp4", encode_mp4(frames)});
      else media.push_back(encode_safetensors({outputs[i]}, {{"content", "rgb frames (this build writes no MP4)"}}));
    }
    return media;
  };
  processors.add(kWanModelType, std::move(pre), std::move(post),
                 [deadline](const GenerationRequest& r) { return wan_request_deadline_seconds(deadline, r); });
}

}  // namespace tessel::engine
