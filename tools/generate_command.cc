// `tessel generate`: runs the Wan denoising loop of a diffusers model directory (model_index.json,
// transformer/, scheduler/, tokenizer/ with text_encoder/ for a prompt, vae/ for frames; Wan 2.2's
// transformer_2/ and boundary_ratio for two experts, its expand_timesteps for TI2V-5B) on a prompt or
// on given text embeddings and writes an MP4 video, PNG frames or the final latents.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache_flags.h"
#include "command.h"
#include "device_memory.h"
#include "generate_output.h"
#include "option_checks.h"
#include "parallel_flags.h"
#include "sparse_attn_flags.h"
#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/limited_json.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/scheduler.h"
#include "tessel/diffusion/wan_pipeline.h"
#include "tessel/diffusion/wan_text_encoder.h"
#include "tessel/diffusion/wan_vae.h"
#include "tessel/sparse/registry.h"

namespace tessel::cli {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMaxModelIndexBytes = 1 << 20;

struct GenerateOptions {
  std::string model_dir;
  std::string prompt;
  std::string negative_prompt;  // WanPipeline's default: the empty prompt
  std::string embeddings;  // safetensors with prompt_embeds (and negative_prompt_embeds)
  std::string noise;       // safetensors with the starting latents as "noise"; empty: --seed
  std::string device = "cpu";
  std::string dtype;       // empty: the device's (fp32 on the CPU, bf16 on CUDA)
  std::string size = "832x480";
  int64_t frames = 81;
  int64_t steps = 50;
  double guidance = 5.0;
  std::optional<double> guidance_2;  // the low-noise expert's (Wan 2.2); unset: --guidance
  std::optional<std::string> sparse_config_2;  // the low-noise expert's sparse config JSON over the first's
  int64_t seed = 42;
  std::string scheduler;  // empty: the model's scheduler/
  double flow_shift = 0.0;  // 0: the scheduler config's
  int64_t threads = 0;
  std::string cache = "none";
  CacheConfig cache_config;  // --teacache-thresh and the --dbcache-* flags
  std::string out;
};

WanVideoSize parse_size(const std::string& text, int64_t frames, int64_t spatial_stride) {
  const size_t x = text.find('x');
  WanVideoSize size;
  size.frames = frames;
  size.vae_spatial_stride = spatial_stride;
  try {
    if (x == std::string::npos) throw std::invalid_argument("no x");
    size_t width_end = 0, height_end = 0;
    size.width = std::stoll(text.substr(0, x), &width_end);
    size.height = std::stoll(text.substr(x + 1), &height_end);
    if (width_end != x || height_end != text.size() - x - 1) throw std::invalid_argument("trailing text");
  } catch (const std::logic_error&) {
    fail_argument("--size", "WIDTHxHEIGHT in pixels, e.g. 832x480", quoted_excerpt(text));
  }
  try {
    size.validate();
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + (std::string(e.what()).rfind("frames", 0) == 0 ? " (--frames)" : " (--size)"));
  }
  return size;
}

// What model_index.json says about the experts: Wan 2.2's A14B layout names `transformer_2` (the
// low-noise expert) and `boundary_ratio`.
struct ModelExperts {
  bool two = false;
  double boundary_ratio = 0.0;
};

bool component_set(const nlohmann::json& index, const char* name) {
  const auto entry = index.find(name);
  // Absent, null or diffusers' [null, null] for a component the pipeline runs without.
  return entry != index.end() && !entry->is_null() && !(entry->is_array() && !entry->empty() && (*entry)[0].is_null());
}

// The parts of a diffusers WanPipeline directory the denoising loop needs, checked before any
// weight is read.
ModelExperts check_model_dir(const std::string& dir, bool needs_text_encoder) {
  const fs::path root(dir);
  const std::string index_path = (root / "model_index.json").string();
  if (!fs::is_regular_file(index_path))
    fail_argument("--model", "a diffusers model directory with model_index.json", quoted_excerpt(dir));
  const nlohmann::json index =
      parse_json_limited(read_file_bounded(index_path, kMaxModelIndexBytes, "model_index.json"), JsonLimits{}, index_path);
  if (!index.is_object()) fail_argument(index_path, "a JSON object", json_excerpt(index));
  const auto class_name = index.find("_class_name");
  if (class_name == index.end() || *class_name != "WanPipeline")
    fail_argument(index_path + ": _class_name", "\"WanPipeline\" (text-to-video)",
                  class_name == index.end() ? std::string("none") : json_excerpt(*class_name));
  // Wan 2.2 TI2V-5B sets expand_timesteps: diffusers then hands the transformer one timestep per
  // token, (mask[0][0][:, ::2, ::2] * t).flatten(). For text to video the mask is all ones, so every
  // token gets t and the per-token time embeddings and modulation equal the scalar ones: the loop
  // runs unchanged (tests/diffusion/wan_ti2v_pipeline_test.cc checks it against diffusers).
  const auto expand = index.find("expand_timesteps");
  if (expand != index.end() && !expand->is_null() && !expand->is_boolean())
    fail_argument(index_path + ": expand_timesteps", "true or false", json_excerpt(*expand));
  ModelExperts experts;
  experts.two = component_set(index, "transformer_2");
  const auto boundary = index.find("boundary_ratio");
  const bool boundary_set = boundary != index.end() && !boundary->is_null();
  if (experts.two != boundary_set)
    fail_argument(index_path + ": transformer_2 and boundary_ratio", "both set (Wan 2.2's two experts) or neither",
                  experts.two ? "transformer_2 without boundary_ratio" : "boundary_ratio without transformer_2");
  if (boundary_set) {
    if (!boundary->is_number() || !(boundary->get<double>() > 0.0 && boundary->get<double>() < 1.0))
      fail_argument(index_path + ": boundary_ratio", "a number in (0, 1)", json_excerpt(*boundary));
    experts.boundary_ratio = boundary->get<double>();
  }
  std::vector<const char*> components = {"transformer", "scheduler"};
  if (experts.two) components.push_back("transformer_2");
  if (needs_text_encoder) components.insert(components.end(), {"tokenizer", "text_encoder"});
  for (const char* component : components)
    if (!fs::is_directory(root / component))
      fail_argument("--model", detail::concat("a directory with ", component, "/", needs_text_encoder ? " (for --prompt)" : ""),
                    quoted_excerpt(dir));
  return experts;
}

Tensor load_named(const SafetensorsFile& file, const std::string& name, const std::string& flag) {
  if (!file.find(name)) fail_argument(flag, "a safetensors file with a tensor \"" + name + "\"", quoted_excerpt(file.path()));
  Tensor tensor = file.load(name);
  return tensor.dtype() == DType::kF32 ? tensor : tensor.to(DType::kF32);
}

// The conditional and (with guidance) unconditional text embeddings, from --prompt through the
// model's tokenizer and text encoder, or read from --embeddings.
// `encode_seconds` gets the time of the encoder's forward alone (tokenizing included, loading the
// weights not); it stays 0 for --embeddings.
std::pair<Tensor, Tensor> text_embeddings(const GenerateOptions& o, bool prompt_set, bool guided, const ExecContext& ctx,
                                          Device device, double& encode_seconds) {
  if (prompt_set) {
    const WanTextEncoder encoder = WanTextEncoder::load(o.model_dir, device);
    const auto encode_start = std::chrono::steady_clock::now();
    const auto encode_seconds_now = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - encode_start).count();
    };
    if (!guided) {
      Tensor prompt = encoder.encode(ctx, {o.prompt});
      encode_seconds = encode_seconds_now();
      return {std::move(prompt), Tensor{}};
    }
    const Tensor both = encoder.encode(ctx, {o.prompt, o.negative_prompt});
    encode_seconds = encode_seconds_now();
    const int64_t length = both.size(1), width = both.size(2);
    Tensor prompt = Tensor::empty({1, length, width}, DType::kF32), negative = Tensor::empty({1, length, width}, DType::kF32);
    std::copy_n(both.data_as<float>(), length * width, prompt.data_as<float>());
    std::copy_n(both.data_as<float>() + length * width, length * width, negative.data_as<float>());
    return {std::move(prompt), std::move(negative)};
  }
  const SafetensorsFile embeddings = SafetensorsFile::open(o.embeddings);
  Tensor prompt = load_named(embeddings, "prompt_embeds", "--embeddings");
  Tensor negative = guided ? load_named(embeddings, "negative_prompt_embeds", "--embeddings") : Tensor{};
  return {std::move(prompt), std::move(negative)};
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Where a generation's time went, and the device memory it held at the step boundaries.
struct GenerateTimings {
  double text_seconds = 0.0;      // tokenizer and text encoder (or reading --embeddings)
  double text_encode_seconds = 0.0;  // of which the encoder's forward (0 with --embeddings)
  double generate_seconds = 0.0;  // the denoising loop and the VAE decode
  std::vector<double> step_seconds;
  double scheduler_seconds = 0.0;
  size_t peak_device_used = 0;

  void record_step(const WanStepProgress& p, Device device) {
    step_seconds.push_back(p.step_seconds);
    scheduler_seconds += p.scheduler_seconds;
    if (const std::optional<DeviceMemory> memory = device_memory(device))
      peak_device_used = std::max(peak_device_used, memory->used);
  }
};

// One human line and one JSON line (prefixed "generate-timings ") that benchmarks parse.
void print_timings(const GenerateTimings& t, Device device, const std::optional<DeviceMemory>& at_start, int64_t steps_done) {
  double denoise = 0.0;
  for (double s : t.step_seconds) denoise += s;
  nlohmann::json report = {{"device", device.str()},
                           {"dtype", device.is_cuda() ? "bf16" : "fp32"},
                           {"steps", steps_done},
                           {"text_encoder_s", t.text_seconds},
                           {"text_encoder_load_s", t.text_seconds - t.text_encode_seconds},
                           {"text_encode_s", t.text_encode_seconds},
                           {"denoise_s", denoise},
                           {"step_s", t.step_seconds},
                           {"scheduler_s", t.scheduler_seconds},
                           {"decode_and_setup_s", t.generate_seconds - denoise},
                           {"total_s", t.text_seconds + t.generate_seconds}};
  std::printf("%s: text encoder %.2f s, %lld steps in %.2f s (%.3f s/step, scheduler %.2f ms/step), decode and setup %.2f s",
              device.str().c_str(), t.text_seconds, static_cast<long long>(steps_done), denoise,
              steps_done ? denoise / static_cast<double>(steps_done) : 0.0,
              steps_done ? t.scheduler_seconds * 1000.0 / static_cast<double>(steps_done) : 0.0, t.generate_seconds - denoise);
  if (at_start && t.peak_device_used >= at_start->used) {
    const size_t taken = t.peak_device_used - at_start->used;
    report["peak_device_memory_bytes"] = taken;
    std::printf(", device memory taken (weights and loop) %s", format_bytes(static_cast<double>(taken)).c_str());
  }
  std::printf("\ngenerate-timings %s\n", report.dump().c_str());
}

// The transformer's device from --device and --dtype: the CPU transformer computes in fp32, the
// CUDA one in bf16 (fp32 residual stream), and each dtype is accepted only where it is what runs.
Device transformer_device(const GenerateOptions& o) {
  const Device device = parse_device(o.device);
  if (device.is_cuda() && !cuda_compiled())
    fail_argument("--device", "cpu (tessel was built without CUDA)", device.str());
  if (device.is_cuda() && !cuda_available()) fail_argument("--device", "a device present (no CUDA GPU found)", device.str());
  const std::string runs = device.is_cuda() ? "bf16" : "fp32";
  if (!o.dtype.empty() && o.dtype != runs)
    fail_argument("--dtype", detail::concat(runs, " on ", device.is_cuda() ? "CUDA" : "the CPU"), o.dtype);
  return device;
}

// Exactly one of --prompt and --embeddings; --negative-prompt only with --prompt.
void check_text_source(const GenerateOptions& o, bool prompt_set, bool negative_prompt_set) {
  if (prompt_set == !o.embeddings.empty())
    fail_argument("--prompt / --embeddings", "exactly one of them", prompt_set ? "both" : "neither");
  if (negative_prompt_set && !prompt_set)
    fail_argument("--negative-prompt", "--prompt too (with --embeddings the negative comes from the file)", "no --prompt");
}

// Per CFG branch: the forwards that skipped blocks, and the blocks skipped of all the forwards'.
void print_cache_stats(const CacheStats& stats, bool guided, const char* expert) {
  const char* const branch_names[2] = {"conditional", "unconditional"};
  std::printf("%s%s: blocks skipped in", stats.backend.c_str(), expert);
  for (size_t b = 0; b < (guided ? 2u : 1u); ++b)
    std::printf("%s %lld of %lld steps (%s branch, %lld of %lld blocks)", b == 0 ? "" : ",",
                static_cast<long long>(stats.skipped[b]), static_cast<long long>(stats.skipped[b] + stats.computed[b]),
                branch_names[b], static_cast<long long>(stats.blocks_skipped[b]),
                static_cast<long long>(stats.blocks_skipped[b] + stats.blocks_computed[b]));
  std::printf("\n");
}

int run_generate(const GenerateOptions& o, const SparseAttnFlags& flags, const ParallelFlags& parallel, bool prompt_set,
                 bool negative_prompt_set) {
  check_text_source(o, prompt_set, negative_prompt_set);
  const ModelExperts experts = check_model_dir(o.model_dir, prompt_set);
  const WanVideoSize size = parse_size(o.size, o.frames, wan_model_vae_spatial_stride(o.model_dir));
  if (!experts.two && o.guidance_2)
    fail_argument("--guidance-2", "a model with transformer_2 (Wan 2.2's low-noise expert)", *o.guidance_2);
  if (!experts.two && o.sparse_config_2)
    fail_argument("--sparse-attn-config-2", "a model with transformer_2 (Wan 2.2's low-noise expert)", quoted_excerpt(*o.sparse_config_2));
  const GenerateOutput output = check_generate_output(o.out, o.model_dir);
  SchedulerConfig scheduler_config = load_scheduler_config((fs::path(o.model_dir) / "scheduler").string());
  if (!o.scheduler.empty()) {
    const SchedulerConfig model_config = scheduler_config;
    scheduler_config = SchedulerConfig{};
    scheduler_config.kind = scheduler_kind_from_name(o.scheduler);
    scheduler_config.num_train_timesteps = model_config.num_train_timesteps;
    scheduler_config.shift = model_config.shift;
  }
  if (o.flow_shift > 0.0) scheduler_config.shift = o.flow_shift;
  const bool guided = o.guidance > 1.0;
  if (parallel.cfg_parallel && !guided) fail_argument("--cfg-parallel", "--guidance above 1 (two branches to split)", o.guidance);
  if (parallel.cfg_parallel && transformer_device(o).is_cuda())
    fail_argument("--cfg-parallel", "--device cpu (the CUDA pipeline runs both guidance branches as one batch)",
                  transformer_device(o).str());
  // A CUDA run over several ranks puts each rank on its local GPU (run.device()).
  ParallelRun run(parallel, transformer_device(o));
  const Device device = run.device();
  ExecContext ctx;
  ctx.num_threads = static_cast<int>(o.threads);
  GenerateTimings timings;
  const std::optional<DeviceMemory> memory_at_start = device_memory(device);
  const auto text_start = std::chrono::steady_clock::now();
  const auto [prompt, negative] = text_embeddings(o, prompt_set, guided, ctx, device, timings.text_encode_seconds);
  timings.text_seconds = seconds_since(text_start);
  const std::string transformer_dir = (fs::path(o.model_dir) / "transformer").string();
  Tensor noise;
  if (!o.noise.empty()) {
    noise = load_named(SafetensorsFile::open(o.noise), "noise", "--noise");
    const Shape latent = size.latent_shape(load_wan_config(transformer_dir).in_channels);
    if (noise.shape() != latent)
      fail_argument("--noise", "a \"noise\" tensor of the latent shape " + shape_str(latent) + " (from --size and --frames)",
                    noise.view().describe());
  }

  // Each expert's sparse config: the flags' (absent: dense), the low-noise one's JSON over it.
  const SparseAttnEnv& env = process_sparse_attn_env();
  std::optional<SparseAttnConfig> sparse, sparse_2;
  if (sparse_attn_requested(flags, env)) sparse = sparse_attn_config_from(flags, env);
  sparse_2 = sparse;
  if (o.sparse_config_2) {
    try {
      sparse_2 = parse_sparse_attn_config_arg(*o.sparse_config_2, "--sparse-attn-config-2", sparse.value_or(SparseAttnConfig{}));
    } catch (const Error& e) {
      throw Error(std::string("--sparse-attn-config-2: ") + e.what());
    }
  }
  const std::unique_ptr<BackendRegistry> registry = sparse || sparse_2 ? make_cli_registry() : nullptr;
  const auto attention_for = [&](const std::optional<SparseAttnConfig>& config, const std::string& transformer_dir) {
    WanAttentionOptions attention;
    attention.parallel = run.groups();
    if (!config) return attention;
    attention.registry = registry.get();
    attention.config = *config;
    attention.backend_override = backend_override(env);
    const WanConfig model = load_wan_config(transformer_dir);
    const Shape latent = size.latent_shape(model.in_channels);
    if (!attention.config.geometry.spatial_layout && model.patch_size[1] == model.patch_size[2])
      attention.config.geometry.spatial_layout = wan_spatial_layout(model, latent[2], latent[3], latent[4]);
    return attention;
  };
  const std::string transformer_2_dir = (fs::path(o.model_dir) / "transformer_2").string();
  const WanTransformer transformer = WanTransformer::load(transformer_dir, attention_for(sparse, transformer_dir), device);
  const std::unique_ptr<const WanTransformer> transformer_2 =
      experts.two ? std::make_unique<const WanTransformer>(WanTransformer::load(transformer_2_dir, attention_for(sparse_2, transformer_2_dir), device))
                  : nullptr;
  auto scheduler = make_scheduler(scheduler_config);
  const std::unique_ptr<const WanVae> vae =
      output == GenerateOutput::kLatents ? nullptr : std::make_unique<const WanVae>(WanVae::load((fs::path(o.model_dir) / "vae").string()));
  const WanPipeline pipeline =
      experts.two ? WanPipeline(transformer, WanLowNoiseExpert{transformer_2.get(), experts.boundary_ratio, scheduler_config.num_train_timesteps},
                                *scheduler, vae.get())
                  : WanPipeline(transformer, *scheduler, vae.get());
  const CacheConfig& cache_config = o.cache_config;
  // One cache per expert: each keeps the residuals of its own blocks.
  const std::unique_ptr<CacheBackend> cache = make_cache_backend(o.cache, cache_config, transformer.config());
  const std::unique_ptr<CacheBackend> cache_2 = transformer_2 ? make_cache_backend(o.cache, cache_config, transformer_2->config()) : nullptr;

  WanGenerationOptions options;
  options.num_inference_steps = o.steps;
  options.guidance_scale = o.guidance;
  options.guidance_scale_2 = o.guidance_2;
  options.seed = static_cast<uint64_t>(o.seed);
  options.size = size;
  options.cache = cache.get();
  options.cache_2 = cache_2.get();
  options.cfg_group = run.cfg_group();
  if (run.is_root()) {  // every rank steps the same latents; one reports
    options.on_step = [&timings, device](const WanStepProgress& p) {
      timings.record_step(p, device);
      std::fprintf(stderr, "step %lld/%lld  t=%g  %.3f s/step (scheduler %.1f ms)  elapsed %.1f s  eta %.1f s\n",
                   static_cast<long long>(p.step), static_cast<long long>(p.total_steps), p.timestep, p.step_seconds,
                   p.scheduler_seconds * 1000.0, p.elapsed_seconds, p.eta_seconds);
    };
  }
  // The text encoder above took its tokens from and gave its embeddings to the host; the denoising
  // loop runs on the transformer's device.
  ExecContext run_ctx = ctx;
  run_ctx.device = device;
  const auto generate_start = std::chrono::steady_clock::now();
  const WanGenerationResult result = pipeline.generate(run_ctx, prompt, negative, options, noise);
  timings.generate_seconds = seconds_since(generate_start);
  if (run.is_root()) print_timings(timings, device, memory_at_start, result.steps_done);
  if (!run.is_root()) return 0;
  if (transformer_2) {
    const auto low = std::count(result.experts.begin(), result.experts.end(), 1);
    std::printf("experts: %lld steps on transformer (high noise), %lld on transformer_2 (low noise), boundary timestep %g\n",
                static_cast<long long>(result.experts.size()) - static_cast<long long>(low), static_cast<long long>(low),
                experts.boundary_ratio * static_cast<double>(scheduler_config.num_train_timesteps));
  }
  if (cache) print_cache_stats(result.cache_stats, guided, transformer_2 ? " (transformer)" : "");
  if (cache_2) print_cache_stats(result.cache_stats_2, guided, " (transformer_2)");
  write_generate_output(output, o.out, result, std::string(scheduler_class_name(scheduler_config.kind)));
  return 0;
}

CommandRegistration registration{
    "generate",
    "Generate a video from a prompt (or text embeddings) with a diffusers Wan model directory: MP4, PNG frames or latents",
    [](CLI::App& app) {
      auto options = std::make_shared<GenerateOptions>();
      auto flags = std::make_shared<SparseAttnFlags>();
      app.add_option("--model", options->model_dir,
                     "diffusers WanPipeline directory (model_index.json, transformer/, scheduler/, tokenizer/, text_encoder/)")
          ->required();
      CLI::Option* prompt = app.add_option("--prompt", options->prompt, "the text to generate from (UTF-8)");
      CLI::Option* negative_prompt = app.add_option("--negative-prompt", options->negative_prompt,
                                                    "the text to steer away from with --guidance > 1 (default: empty, as WanPipeline)");
      app.add_option("--embeddings", options->embeddings,
                     "instead of --prompt: safetensors with prompt_embeds (1, L, text_dim) and negative_prompt_embeds (1, L, text_dim)");
      app.add_option("--device", options->device, "cpu (fp32) or cuda[:N] (bf16 weights and GEMMs, fp32 residual stream)")
          ->capture_default_str()
          ->check(device_name());
      app.add_option("--dtype", options->dtype, "the transformer's compute type: fp32 (CPU) or bf16 (CUDA); default: the device's")
          ->check(one_of({"fp32", "bf16"}));
      app.add_option("--noise", options->noise, "safetensors whose \"noise\" tensor is the starting latent (default: from --seed)");
      app.add_option("--size", options->size, "WIDTHxHEIGHT in pixels, multiples of 16 (32 with Wan 2.2's TI2V VAE)")
          ->capture_default_str();
      app.add_option("--frames", options->frames, "video frames, 4k + 1")->capture_default_str()->check(integer_in(1, 1 << 16));
      app.add_option("--steps", options->steps, "denoising steps")->capture_default_str()->check(integer_in(1, 100000));
      app.add_option("--guidance", options->guidance, "classifier-free guidance scale (1: none)")
          ->capture_default_str()
          ->check(number_in(0.0, 1000.0));
      app.add_option("--guidance-2", options->guidance_2,
                     "Wan 2.2 two-expert models: the low-noise expert's guidance scale (default: --guidance)")
          ->check(number_in(0.0, 1000.0));
      app.add_option("--sparse-attn-config-2", options->sparse_config_2,
                     "Wan 2.2 two-expert models: the low-noise expert's (transformer_2) sparse config, JSON or @file.json, "
                     "over the first expert's (default: the same)");
      app.add_option("--seed", options->seed, "seed of the starting noise")->capture_default_str()->check(integer_in(0, INT64_MAX));
      app.add_option("--scheduler", options->scheduler, "unipc or euler (default: the model's scheduler/)")
          ->check(one_of({"unipc", "euler"}));
      app.add_option("--flow-shift", options->flow_shift, "the schedule's shift (default: the scheduler config's)")
          ->check(number_in(0.0, 1000.0, Bounds::kOpenLow));
      app.add_option("--threads", options->threads, "CPU threads (default: all)")->check(integer_in(1, 4096));
      add_cache_flags(app, options->cache, options->cache_config);
      app.add_option("--out", options->out,
                     "output: video.mp4, frames.png (one file per frame: frames_00000.png, ...) or latents.safetensors")
          ->required();
      add_sparse_attn_flags(app, *flags);
      auto parallel = std::make_shared<ParallelFlags>();
      add_parallel_flags(app, *parallel);
      return CommandRunner([options, flags, parallel, prompt, negative_prompt] {
        return run_generate(*options, *flags, *parallel, prompt->count() > 0, negative_prompt->count() > 0);
      });
    }};

}  // namespace
}  // namespace tessel::cli
