// `tessel generate`: runs the Wan denoising loop of a diffusers model directory (model_index.json,
// transformer/, scheduler/, tokenizer/ with text_encoder/ for a prompt, vae/ for frames; Wan 2.2's
// transformer_2/ and boundary_ratio for two experts, its expand_timesteps for TI2V-5B; an
// image-to-video directory's image_encoder/ with --image) on a prompt or on given text embeddings
// and writes an MP4 video, PNG frames or the final latents.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache_flags.h"
#include "lora_flags.h"
#include "offload_flags.h"
#include "weights_flags.h"
#include "attention_dtype_flag.h"
#include "command.h"
#include "device_memory.h"
#include "generate_output.h"
#include "option_checks.h"
#include "parallel_flags.h"
#include "sparse_attn_flags.h"
#include "generate_estimate.h"
#include "text_embeddings.h"
#include "work_budget.h"
#include "tessel/core/error.h"
#include "tessel/core/finite_check.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/limited_json.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/image_io.h"
#include "tessel/diffusion/scheduler.h"
#include "tessel/diffusion/wan_generator.h"
#include "tessel/diffusion/wan_pipeline.h"
#include "tessel/sparse/registry.h"

namespace tessel::cli {
namespace {

namespace fs = std::filesystem;

struct GenerateOptions {
  std::string model_dir;
  std::string prompt;
  std::string negative_prompt;  // WanPipeline's default: the empty prompt
  std::string embeddings;  // safetensors with prompt_embeds (and negative_prompt_embeds)
  std::string noise;       // safetensors with the starting latents as "noise"; empty: --seed
  std::string image, last_image;  // image to video: the first (and FLF2V's last) frame, PNG or JPEG
  std::string device = "cpu";
  std::string dtype;       // empty: the device's (fp32 on the CPU, bf16 on CUDA)
  std::string size = "832x480";
  int64_t frames = 81;
  int64_t steps = 50;
  double guidance = 5.0;
  std::optional<double> guidance_2;  // the low-noise expert's (Wan 2.2); unset: --guidance
  std::optional<std::string> sparse_config_2;  // the low-noise expert's sparse config JSON over the first's
  int64_t seed = 42;
  int64_t num_outputs = 1;  // generations of one request, seeds seed, seed + 1, ...: one batch per step
  std::string scheduler;  // empty: the model's scheduler/
  double flow_shift = 0.0;  // 0: the scheduler config's
  int64_t threads = 0;
  std::string cache = "none";
  CacheConfig cache_config;  // --teacache-thresh and the --dbcache-* flags
  std::string offload = "none";
  std::string weights = "bf16";
  std::string attention_dtype = "bf16";
  std::string transformer_file;
  std::string transformer_2_file;
  std::string out;
  BudgetFlags budget;
};

Tensor load_named(const SafetensorsFile& file, const std::string& name, const std::string& flag) {
  if (!file.find(name)) fail_argument(flag, "a safetensors file with a tensor \"" + name + "\"", quoted_excerpt(file.path()));
  Tensor tensor = file.load(name);
  return tensor.dtype() == DType::kF32 ? tensor : tensor.to(DType::kF32);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Where a generation's time went, and the device memory it held at the step boundaries.
struct GenerateTimings {
  // Loading every component the run needs (WanGenerator::load: transformers, text encoder, VAE),
  // then the text encoder's forward (0 with --embeddings); text_seconds is both, as the
  // generate-timings keys text_encoder_s / text_encoder_load_s / text_encode_s report them.
  double load_seconds = 0.0;
  double text_encode_seconds = 0.0;
  double text_seconds = 0.0;
  double generate_seconds = 0.0;  // the denoising loop and the VAE decode
  std::vector<double> step_seconds;
  double scheduler_seconds = 0.0;
  size_t peak_device_used = 0;
  // The transformers' (both experts') weights on the device, and what block offload keeps in host
  // memory instead; set after the generation.
  size_t weight_bytes = 0, offloaded_weight_bytes = 0;

  void record_step(const WanStepProgress& p, Device device) {
    step_seconds.push_back(p.step_seconds);
    scheduler_seconds += p.scheduler_seconds;
    if (const std::optional<DeviceMemory> memory = device_memory(device))
      peak_device_used = std::max(peak_device_used, memory->used);
  }
};

// One human line and one JSON line (prefixed "generate-timings ") that benchmarks parse.
void print_timings(const GenerateTimings& t, Device device, const std::optional<DeviceMemory>& at_start, int64_t steps_done,
                   const WorkEstimate& estimate) {
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
  std::printf("%s: load and text encoder %.2f s, %lld steps in %.2f s (%.3f s/step, scheduler %.2f ms/step), decode and setup %.2f s",
              device.str().c_str(), t.text_seconds, static_cast<long long>(steps_done), denoise,
              steps_done ? denoise / static_cast<double>(steps_done) : 0.0,
              steps_done ? t.scheduler_seconds * 1000.0 / static_cast<double>(steps_done) : 0.0, t.generate_seconds - denoise);
  if (device.is_cuda()) {
    report["weights_bytes"] = t.weight_bytes;
    report["offloaded_weights_bytes"] = t.offloaded_weight_bytes;
    std::printf(", transformer weights %s", format_bytes(static_cast<double>(t.weight_bytes)).c_str());
    if (t.offloaded_weight_bytes > 0)
      std::printf(" (blocks offloaded: %s in pinned host memory)", format_bytes(static_cast<double>(t.offloaded_weight_bytes)).c_str());
  }
  if (at_start && t.peak_device_used >= at_start->used) {
    const size_t taken = t.peak_device_used - at_start->used;
    report["peak_device_memory_bytes"] = taken;
    std::printf(", device memory taken (weights and loop) %s", format_bytes(static_cast<double>(taken)).c_str());
    if (device.is_cuda() && taken >= t.weight_bytes)
      std::printf(" of which the loop's activations and caches %s", format_bytes(static_cast<double>(taken - t.weight_bytes)).c_str());
  }
  if (device.is_cuda()) {
    report["estimated_device_memory_bytes"] = estimate.device_bytes;
    std::printf(", device memory estimated with the decode %s", format_bytes(estimate.device_bytes).c_str());
  }
  report["estimated_host_memory_bytes"] = estimate.host_bytes;
  report["peak_host_memory_bytes"] = peak_host_memory_bytes();
  std::printf(", peak host memory %s (estimated %s)", format_bytes(peak_host_memory_bytes()).c_str(), format_bytes(estimate.host_bytes).c_str());
  std::printf("\ngenerate-timings %s\n", report.dump().c_str());
}

// The transformer's device from --device and --dtype: the CPU transformer computes in fp32, the
// CUDA one in bf16 (fp32 residual stream), and each dtype is accepted only where it is what runs.
Device transformer_device(const GenerateOptions& o) {
  const Device device = budget_device(o.budget, o.device, "--device");
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

// --image and --last-image against the model's task, before any weight is read.
void check_image_flags(const GenerateOptions& o, const WanModelDir& model) {
  const bool image_to_video = model.task == WanTask::kImageToVideo;
  // Wan 2.2 TI2V-5B takes an image or none (its latents become the first frame), never a last one.
  if (model.task == WanTask::kTextImageToVideo) {
    if (!o.last_image.empty())
      fail_argument("--last-image", "none: TI2V's image to video takes the first frame only (--image)", quoted_excerpt(o.last_image));
    return;
  }
  if (!image_to_video && !(o.image.empty() && o.last_image.empty()))
    fail_argument(o.image.empty() ? "--last-image" : "--image",
                  "an image-to-video model (a WanImageToVideoPipeline directory, or TI2V's); --model is a " +
                      std::string(wan_task_name(model.task)) + " model",
                  quoted_excerpt(o.image.empty() ? o.last_image : o.image));
  if (image_to_video && o.image.empty())
    fail_argument("--image", "the first frame (PNG or JPEG) of this image-to-video model's video", "none");
  const WanConfig& t = model.transformer;
  if (image_to_video && t.pos_embed_seq_len > 0 && o.last_image.empty())
    fail_argument("--last-image", "the last frame: this FLF2V transformer conditions on a first and a last image", "none");
  if (image_to_video && t.has_image_branch() && t.pos_embed_seq_len == 0 && !o.last_image.empty())
    fail_argument("--last-image", "none: this Wan 2.1 I2V transformer's image branch takes one image (FLF2V models take two)",
                  quoted_excerpt(o.last_image));
}

// "out.mp4" -> "out-3.mp4" (--out always names a file: .mp4, .png or .safetensors).
std::string indexed_output_path(const std::string& out, int64_t index) {
  const std::filesystem::path path(out);
  return (path.parent_path() / (path.stem().string() + "-" + std::to_string(index) + path.extension().string())).string();
}

int run_generate(const GenerateOptions& o, const SparseAttnFlags& flags, const LoraFlags& lora, const ParallelFlags& parallel,
                 bool prompt_set, bool negative_prompt_set) {
  check_text_source(o, prompt_set, negative_prompt_set);
  // The model directory, read once by the library's door; the flags are checked against it
  // before any weight is read.
  const WanModelDir model = WanModelDir::open(o.model_dir);
  if (prompt_set && !model.has_text_encoder)
    fail_argument("--model", "a directory with tokenizer/ (for --prompt) and text_encoder/", quoted_excerpt(o.model_dir));
  const WanVideoSize size = parse_video_size(o.size, o.frames, model.vae_spatial_stride);
  if (!model.two_experts && o.guidance_2)
    fail_argument("--guidance-2", "a model with transformer_2 (Wan 2.2's low-noise expert)", *o.guidance_2);
  if (!model.two_experts && o.sparse_config_2)
    fail_argument("--sparse-attn-config-2", "a model with transformer_2 (Wan 2.2's low-noise expert)", quoted_excerpt(*o.sparse_config_2));
  if (!model.two_experts && !lora.loras_2.empty())
    fail_argument("--lora-2", "a model with transformer_2 (Wan 2.2's low-noise expert)", quoted_excerpt(lora.loras_2[0]));
  if (lora.ignore_unmatched && lora.loras.empty() && lora.loras_2.empty())
    fail_argument("--lora-ignore-unmatched", "a --lora or --lora-2 to apply it to", "none");
  check_image_flags(o, model);
  const GenerateOutput output = check_generate_output(o.out, o.model_dir);
  if (o.num_outputs > 1 && !o.noise.empty())
    fail_argument("--num-outputs", "1 with --noise (every output would start from the same latents)", o.num_outputs);
  if (!o.scheduler.empty()) scheduler_kind_from_name(o.scheduler);
  const bool guided = o.guidance > 1.0;
  if (parallel.cfg_parallel && !guided) fail_argument("--cfg-parallel", "--guidance above 1 (two branches to split)", o.guidance);
  // Memory and time from the configs and the flags, before any weight is read (one rank's share
  // under sequence parallelism).
  const Device asked = transformer_device(o);
  const int64_t encoded_frames = o.image.empty() ? 0 : model.task == WanTask::kImageToVideo ? size.frames : 1;
  const GenerateShape shape{size, o.steps, o.num_outputs, guided, prompt_set, output != GenerateOutput::kLatents, encoded_frames,
                            o.weights == "fp8", o.attention_dtype == "fp8"};
  const int ranks = parallel.ulysses * parallel.ring * (parallel.cfg_parallel ? 2 : 1);
  const WorkEstimate estimate = generate_estimate(model, shape, parallel, asked);
  if (!check_work_budget(estimate, o.budget, asked, static_cast<int>(o.threads),
                         detail::concat("--size ", o.size, " --frames ", o.frames, " --steps ", o.steps, " --num-outputs ", o.num_outputs,
                                        " --model ", quoted_excerpt(o.model_dir)),
                         ranks > 1 ? detail::concat("generate, per rank of ", ranks) : std::string("generate")))
    return 0;
  // A CUDA run over several ranks puts each rank on its local GPU (run.device()).
  ParallelRun run(parallel, asked);
  const Device device = run.device();
  ExecContext ctx;
  ctx.num_threads = static_cast<int>(o.threads);
  GenerateTimings timings;
  const std::optional<DeviceMemory> memory_at_start = device_memory(device);

  WanRequest request;
  if (prompt_set) {
    request.prompt = o.prompt;
    request.negative_prompt = o.negative_prompt;
  } else {
    TextEmbeddings embeddings = read_text_embeddings(o.embeddings, model.transformer.text_dim, guided);
    request.prompt_embeds = std::move(embeddings.prompt);
    if (guided) request.negative_prompt_embeds = std::move(embeddings.negative);
  }
  if (!o.noise.empty()) {
    request.noise = load_named(SafetensorsFile::open(o.noise), "noise", "--noise");
    check_finite(request.noise, "--noise");
    const Shape latent = size.latent_shape(model.transformer.out_channels);
    if (request.noise.shape() != latent)
      fail_argument("--noise", "a \"noise\" tensor of the latent shape " + shape_str(latent) + " (from --size and --frames)",
                    request.noise.view().describe());
  }
  // The images, read once here (their errors name the flag); the door checks them against the model.
  const auto read_flag_image = [](const std::string& path, const char* flag) {
    try {
      return read_image(path);
    } catch (const Error& e) {
      throw Error(std::string(flag) + ": " + e.what());
    }
  };
  if (!o.image.empty()) request.image = read_flag_image(o.image, "--image");
  if (!o.last_image.empty()) request.last_image = read_flag_image(o.last_image, "--last-image");
  request.frames = size.frames;
  request.height = size.height;
  request.width = size.width;
  request.steps = o.steps;
  request.guidance = o.guidance;
  request.guidance_2 = o.guidance_2;
  request.seed = static_cast<uint64_t>(o.seed);

  // Each expert's sparse config: the flags' (absent: dense), the low-noise one's JSON over it.
  const SparseAttnEnv& env = process_sparse_attn_env();
  WanLoadOptions load;
  load.device = device;
  load.residency = offload_residency(o.offload, device);
  load.precision = weights_precision(o.weights, device);
  load.attention_precision = attention_precision(o.attention_dtype, device);
  load.transformer_file = o.transformer_file;
  load.transformer_2_file = o.transformer_2_file;
  if (sparse_attn_requested(flags, env)) load.sparse.config = sparse_attn_config_from(flags, env);
  if (o.sparse_config_2) {
    try {
      load.sparse.config_2 =
          parse_sparse_attn_config_arg(*o.sparse_config_2, "--sparse-attn-config-2", load.sparse.config.value_or(SparseAttnConfig{}));
    } catch (const Error& e) {
      throw Error(std::string("--sparse-attn-config-2: ") + e.what());
    }
  }
  const std::unique_ptr<BackendRegistry> registry = load.sparse.config || load.sparse.config_2 ? make_cli_registry() : nullptr;
  load.registry = registry.get();
  load.backend_override = backend_override(env);
  load.layout_size = size;  // spatial patterns on this run's latent grid
  load.scheduler = o.scheduler;
  load.flow_shift = o.flow_shift;
  load.cache = o.cache;
  load.cache_config = o.cache_config;
  load.parallel = run.groups();
  load.loras = lora_files(lora.loras, "--lora");
  load.loras_2 = lora_files(lora.loras_2, "--lora-2");
  load.lora_ignore_unmatched = lora.ignore_unmatched;
  load.load_text_encoder = prompt_set;
  // Latents out need no decode; an image still needs the VAE's encoder (the request then skips the decode).
  load.load_vae = output != GenerateOutput::kLatents || !o.image.empty();
  request.decode = output != GenerateOutput::kLatents;
  const auto load_start = std::chrono::steady_clock::now();
  WanGenerator generator = WanGenerator::load(ctx, model, load);
  timings.load_seconds = seconds_since(load_start);
  if (run.is_root())
    for (const std::string& line : generator.lora_summary()) std::fprintf(stderr, "lora: %s\n", line.c_str());

  // Progress on stderr (rank 0 alone: every rank steps the same latents): one line that updates
  // in place on a terminal (phase, step, time per step, ETA), a line per event in a log.
  const bool terminal = ::isatty(STDERR_FILENO) == 1;
  const auto progress_line = [terminal](const std::string& text) {
    std::fprintf(stderr, terminal ? "\r\033[K%s" : "%s\n", text.c_str());
    std::fflush(stderr);
  };
  if (run.is_root()) {
    request.on_phase = [&](std::string_view phase) { progress_line(detail::concat(phase, "...")); };
    request.on_step = [&timings, device, &progress_line](const WanStepProgress& p) {
      timings.record_step(p, device);
      char line[256];
      std::snprintf(line, sizeof(line), "denoising: step %lld/%lld  t=%g  %.3f s/step (scheduler %.1f ms)  elapsed %.1f s  eta %.1f s",
                    static_cast<long long>(p.step), static_cast<long long>(p.total_steps), p.timestep, p.step_seconds,
                    p.scheduler_seconds * 1000.0, p.elapsed_seconds, p.eta_seconds);
      progress_line(line);
    };
    request.on_decode_chunk = [&progress_line](int64_t done, int64_t chunks) {
      progress_line(detail::concat("decoding: latent frame ", done, "/", chunks));
    };
  }
  const auto generate_start = std::chrono::steady_clock::now();
  // --num-outputs: the generator's several-request door, which steps them as one batch.
  std::vector<WanRequest> requests(static_cast<size_t>(o.num_outputs), request);
  for (size_t i = 1; i < requests.size(); ++i) {
    requests[i].seed = request.seed + i;
    requests[i].on_step = nullptr, requests[i].on_phase = nullptr;  // the first reports the batch's steps
  }
  const std::vector<WanGeneratorResult> generations = generator.generate(ctx, requests);
  const WanGeneratorResult& generated = generations.front();
  if (run.is_root() && terminal) std::fputc('\n', stderr);
  const WanGenerationResult& result = generated.generation;
  timings.text_encode_seconds = generated.text_encode_seconds;
  timings.text_seconds = timings.load_seconds + timings.text_encode_seconds;
  timings.generate_seconds = seconds_since(generate_start) - generated.text_encode_seconds;
  for (int expert = 0; expert < (model.two_experts ? 2 : 1); ++expert) {
    const WanTransformer& transformer = generator.transformer(request.sparse_setting, expert);
    timings.weight_bytes += transformer.weight_bytes();
    timings.offloaded_weight_bytes += transformer.offloaded_weight_bytes();
  }
  if (run.is_root()) print_timings(timings, device, memory_at_start, result.steps_done, estimate);
  if (!run.is_root()) return 0;
  if (model.two_experts) {
    const auto low = std::count(result.experts.begin(), result.experts.end(), 1);
    std::printf("experts: %lld steps on transformer (high noise), %lld on transformer_2 (low noise), boundary timestep %g\n",
                static_cast<long long>(result.experts.size()) - static_cast<long long>(low), static_cast<long long>(low),
                model.boundary_ratio * static_cast<double>(model.scheduler.num_train_timesteps));
  }
  const bool cached = o.cache != "none";
  if (cached) print_cache_stats(result.cache_stats, guided, model.two_experts ? " (transformer)" : "");
  if (cached && model.two_experts) print_cache_stats(result.cache_stats_2, guided, " (transformer_2)");
  const SchedulerKind scheduler_kind = o.scheduler.empty() ? model.scheduler.kind : scheduler_kind_from_name(o.scheduler);
  const std::string scheduler_name(scheduler_class_name(scheduler_kind));
  if (o.num_outputs == 1) {
    progress_line("writing " + o.out + "...");
    write_generate_output(output, o.out, result, scheduler_name);
    return 0;
  }
  for (int64_t i = 0; i < o.num_outputs; ++i) {
    const std::string path = indexed_output_path(o.out, i);
    progress_line("writing " + path + "...");
    write_generate_output(output, path, generations[static_cast<size_t>(i)].generation, scheduler_name);
  }
  return 0;
}

CommandRegistration registration{
    "generate",
    "Generate a video from a prompt (or text embeddings) with a diffusers Wan model directory: MP4, PNG frames or latents",
    [](CLI::App& app) {
      auto options = std::make_shared<GenerateOptions>();
      auto flags = std::make_shared<SparseAttnFlags>();
      app.add_option("--model", options->model_dir,
                     "diffusers WanPipeline or WanImageToVideoPipeline directory (model_index.json, transformer/, scheduler/, tokenizer/, text_encoder/)")
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
      app.add_option("--image", options->image,
                     "image to video (a WanImageToVideoPipeline model): the first frame, PNG or JPEG; resized to --size with "
                     "Lanczos when its size is another (give the video's aspect ratio to keep it)")
          ->check(non_empty_path());
      app.add_option("--last-image", options->last_image,
                     "image to video: the last frame too (Wan 2.1 FLF2V, Wan 2.2 I2V-A14B), PNG or JPEG")
          ->check(non_empty_path());
      app.add_option("--size", options->size, "WIDTHxHEIGHT in pixels, multiples of 16 (32 with Wan 2.2's TI2V VAE)")
          ->capture_default_str()
          ->check(width_height());
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
      app.add_option("--num-outputs", options->num_outputs,
                     "outputs of this request, seeds --seed, --seed + 1, ..., denoised as one batch per step; "
                     "written as OUT with -0, -1, ... before the extension")
          ->capture_default_str()
          ->check(integer_in(1, 64));
      app.add_option("--scheduler", options->scheduler, "unipc or euler (default: the model's scheduler/)")
          ->check(one_of({"unipc", "euler"}));
      app.add_option("--flow-shift", options->flow_shift, "the schedule's shift (default: the scheduler config's)")
          ->check(number_in(0.0, 1000.0, Bounds::kOpenLow));
      app.add_option("--threads", options->threads, "CPU threads (default: all)")->check(integer_in(1, 4096));
      add_cache_flags(app, options->cache, options->cache_config);
      app.add_option("--out", options->out,
                     "output: video.mp4, frames.png (one file per frame: frames_00000.png, ...) or latents.safetensors")
          ->required()
          ->check(writable_file_path());
      add_sparse_attn_flags(app, *flags);
      auto lora = std::make_shared<LoraFlags>();
      add_lora_flags(app, *lora);
      add_offload_flag(app, options->offload);
      add_weights_flag(app, options->weights);
      add_attention_dtype_flag(app, options->attention_dtype);
      add_transformer_file_flags(app, options->transformer_file, &options->transformer_2_file);
      auto parallel = std::make_shared<ParallelFlags>();
      add_parallel_flags(app, *parallel);
      add_budget_flags(app, options->budget);
      return CommandRunner([options, flags, lora, parallel, prompt, negative_prompt] {
        return run_generate(*options, *flags, *lora, *parallel, prompt->count() > 0, negative_prompt->count() > 0);
      });
    }};

}  // namespace
}  // namespace tessel::cli
