// `tessel serve`: the HTTP server over the diffusion engine. Starts the engine's worker processes
// (`tessel engine-worker`, one per GPU), binds the port, serves until SIGTERM or SIGINT, then
// drains: it stops accepting, lets running and queued work finish (cancelling what is left after
// --drain-timeout), stops the workers and exits 0.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <thread>

#include "cache_flags.h"
#include "lora_flags.h"
#include "offload_flags.h"
#include "parallel_flags.h"
#include "weights_flags.h"
#include "attention_dtype_flag.h"
#include "command.h"
#include "option_checks.h"
#include "text_embeddings.h"
#include "serve/http_server.h"
#include "sparse_attn_flags.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"
#include "tessel/diffusion/cache_backend.h"
#include "tessel/diffusion/wan_generator.h"
#include "tessel/diffusion/wan_pipeline.h"
#include "tessel/diffusion/wan_vae.h"
#include "tessel/dit/wan_model.h"
#include "tessel/engine/engine.h"
#include "tessel/engine/wan_deadline.h"
#include "tessel/engine/wan_serving.h"
#include "tessel/core/finite_check.h"
#include "tessel/core/io/safetensors.h"

namespace tessel::cli {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

struct ServeOptions {
  std::string model_dir;
  std::string served_model_name;
  std::string embeddings;
  std::optional<std::string> sparse_config_2;  // the low-noise expert's sparse config over the first's
  std::optional<int64_t> num_gpus;  // unset: the parallel layout's product
  int ulysses = 1;
  int ring = 1;
  bool cfg_parallel = false;
  int ulysses_head_groups = ParallelConfig{}.ulysses_head_groups;
  int ulysses_sm_margin = ParallelConfig{}.ulysses_sm_margin;
  int64_t max_queue = 8;
  std::optional<int64_t> max_batch;  // unset: kDefaultMaxBatch for one worker, 1 for a group
  int64_t batch_join_ms = 0;
  int64_t threads = 0;
  std::string device = "cpu";
  std::string size = "832x480";
  int64_t frames = 81;
  int64_t steps = 50;
  double guidance = 5.0;
  double fps = 16.0;
  std::string scheduler;
  double flow_shift = 0.0;
  std::vector<std::string> sparse_attention_allowed;  // NAME=dense|'<json>'|@file.json
  std::string cache = "none";
  CacheConfig cache_config;  // --teacache-thresh and the --dbcache-* flags
  std::string offload = "none";
  std::string weights = "bf16";
  std::string attention_dtype = "bf16";
  std::string transformer_file;
  std::string transformer_2_file;
  std::string request_timeout = "auto";  // "auto", or whole seconds (0: none): request_timeout_value()
  int64_t drain_timeout_s = 60;
  serve::ServerOptions server;
  int64_t image_timeout_s = 3600;
  int64_t keep_alive_s = 5;
  int64_t worker_stall_s = 10;
};

// Requests one worker keeps in flight by default: enough to fill a GPU's step with small image
// requests, few enough that a request's step time stays within a small multiple of its own.
constexpr int64_t kDefaultMaxBatch = 8;

constexpr int64_t kMaxRequestTimeoutSeconds = 1 << 24;

// --request-timeout: "auto" (each request's deadline sized from the model and the request), or
// whole seconds for every request, 0 for none.
CLI::Validator request_timeout_value() {
  const std::string expected = detail::concat("auto, or whole seconds in [0, ", kMaxRequestTimeoutSeconds, "] (0: no limit)");
  const CLI::Validator seconds = integer_in(0, kMaxRequestTimeoutSeconds);
  return CLI::Validator(
      [expected, seconds](std::string& text) -> std::string {
        if (text == "auto" || seconds(text).empty()) return "";
        return "expected " + expected + ", got " + quoted_excerpt(text, 40);
      },
      expected, "REQUEST_TIMEOUT");
}

// The start-up log's line on the request deadline: a fixed one, none, or what auto gives the
// default video and image requests.
std::string request_timeout_summary(const engine::EngineConfig& config, const engine::WanDeadlineModel& deadline,
                                    const serve::ApiDefaults& api) {
  if (!config.request_timeout_auto)
    return config.request_timeout.count() > 0 ? detail::concat(config.request_timeout.count() / 1000, " s for every request")
                                              : std::string("none");
  engine::GenerationRequest request;
  request.width = api.default_width;
  request.height = api.default_height;
  request.num_inference_steps = api.default_steps;
  request.guidance_scale = api.default_guidance;
  request.frames = 1;
  const double image = engine::wan_request_deadline_seconds(deadline, request);
  request.frames = api.default_frames;
  const double video = engine::wan_request_deadline_seconds(deadline, request);
  return detail::concat("auto, sized per request (a default video ", video, " s, a default image ", image, " s)");
}

std::string this_executable() {
  std::error_code error;
  const fs::path path = fs::read_symlink("/proc/self/exe", error);
  if (error) throw Error("cannot find the tessel executable (/proc/self/exe) to start the workers: " + error.message());
  return path.string();
}

// The estimators of dynamic_topk and threshold read q and k, not the token grid: their settings
// serve any size. Every other pattern may lay its mask out on the latent grid.
bool reads_latent_layout(const SparseAttnConfig& config) {
  return config.pattern.type != PatternType::kDynamicTopk && config.pattern.type != PatternType::kThreshold;
}

// A config as the workers take it: patterns that read the latent layout get the default size's, as
// `tessel generate` does for its one size (requests of another size are then refused, naming it).
std::string worker_config_json(SparseAttnConfig config, const ServeOptions& o, int64_t width, int64_t height) {
  const WanConfig model = load_wan_config((fs::path(o.model_dir) / "transformer").string());
  WanVideoSize size{o.frames, height, width};
  size.vae_spatial_stride = wan_model_vae_spatial_stride(o.model_dir);
  const Shape latent = size.latent_shape(model.in_channels);
  if (reads_latent_layout(config) && !config.geometry.spatial_layout && model.patch_size[1] == model.patch_size[2])
    config.geometry.spatial_layout = wan_spatial_layout(model, latent[2], latent[3], latent[4]);
  return config.to_json();
}

// The patch grid (frames, height, width) each setting's mask is laid out on, for the requests'
// pre-processing: a request of another grid is refused before it reaches the workers.
std::map<std::string, std::array<int64_t, 3>> layout_bound_settings(const engine::WanRunnerConfig& runner) {
  std::map<std::string, std::array<int64_t, 3>> bound;
  const auto add = [&](const std::string& name, const std::string& json) {
    if (json.empty()) return;
    const SparseAttnConfig config = parse_sparse_attn_json(json);
    if (const auto& layout = config.geometry.spatial_layout)
      bound[name] = {layout->frames, layout->grid_height(), layout->grid_width()};
  };
  add("default", runner.sparse_attn_config_json);
  for (const auto& [name, json] : runner.sparse_attention_settings) add(name, json);
  return bound;
}

// The default sparse-attention config ("" for dense).
std::string sparse_config_json(const ServeOptions& o, const SparseAttnFlags& flags, int64_t width, int64_t height) {
  const SparseAttnEnv& env = process_sparse_attn_env();
  if (!sparse_attn_requested(flags, env)) return "";
  return worker_config_json(sparse_attn_config_from(flags, env), o, width, height);
}

// --sparse-attn-allow NAME=dense|'<json>'|@file.json, each a setting a request may name.
std::map<std::string, std::string> allowed_settings(const ServeOptions& o, int64_t width, int64_t height) {
  std::map<std::string, std::string> settings;
  for (const std::string& entry : o.sparse_attention_allowed) {
    const size_t equals = entry.find('=');
    const std::string name = entry.substr(0, equals);
    if (equals == std::string::npos || name.empty() || name == "default" ||
        name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != std::string::npos)
      fail_argument("--sparse-attn-allow", "NAME=dense|'<json>'|@file.json with NAME of letters, digits, _ and - (not default)",
                    quoted_excerpt(entry));
    const std::string value = entry.substr(equals + 1);
    try {
      settings[name] = value == "dense" ? "" : worker_config_json(parse_sparse_attn_config_arg(value, "--sparse-attn-allow"), o, width, height);
    } catch (const Error& e) {
      throw Error("--sparse-attn-allow " + name + ": " + e.what());
    }
  }
  return settings;
}

// SIGTERM and SIGINT are blocked in every thread (the engine's and the HTTP pool's inherit the mask)
// and taken by one watcher thread, which starts the drain.
sigset_t shutdown_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

int run_serve(ServeOptions o, const SparseAttnFlags& flags, const LoraFlags& lora) {
  const auto [width, height] = parse_width_height(o.size, "--size");
  // Each adapter's name, scale and file, before the model is read: the errors name the flag.
  const std::vector<std::pair<std::string, LoraFile>> adapters = lora_adapters(lora.adapters);
  // The model directory, read and checked once (the workers' generator reads it again).
  const WanModelDir model = WanModelDir::open(o.model_dir);
  // The defaults every request without its own size and frames gets: a model's size, checked now.
  parse_video_size(o.size, o.frames, model.vae_spatial_stride);
  if (!model.two_experts && o.sparse_config_2)
    fail_argument("--sparse-attn-config-2", "a model with transformer_2 (Wan 2.2's low-noise expert)", quoted_excerpt(*o.sparse_config_2));
  if (!model.two_experts && !lora.loras_2.empty())
    fail_argument("--lora-2", "a model with transformer_2 (Wan 2.2's low-noise expert)", quoted_excerpt(lora.loras_2[0]));
  if (model.two_experts && !lora.adapters.empty())
    fail_argument("--lora-adapter", "a model with one expert (Wan 2.2's experts take merged LoRAs: --lora, --lora-2)",
                  quoted_excerpt(lora.adapters[0]));
  if (lora.ignore_unmatched && lora.loras.empty() && lora.loras_2.empty() && lora.adapters.empty())
    fail_argument("--lora-ignore-unmatched", "a --lora, --lora-2 or --lora-adapter to apply it to", "none");
  engine::WanRunnerConfig runner;
  // Checked here (paths and scales), read and matched by every worker's generator at start-up.
  for (const LoraFile& file : lora_files(lora.loras, "--lora")) runner.loras.push_back({fs::absolute(file.path).string(), file.scale});
  for (const LoraFile& file : lora_files(lora.loras_2, "--lora-2")) runner.loras_2.push_back({fs::absolute(file.path).string(), file.scale});
  for (const auto& [name, file] : adapters) runner.lora_adapters.push_back({name, {fs::absolute(file.path).string(), file.scale}});
  runner.lora_ignore_unmatched = lora.ignore_unmatched;
  runner.embeddings_file = o.embeddings.empty() ? "" : fs::absolute(o.embeddings).string();
  // Read once here so a bad file fails the start, not every request.
  if (!o.embeddings.empty()) read_text_embeddings(o.embeddings, model.transformer.text_dim, false);
  runner.num_threads = static_cast<int>(o.threads);
  const Device device = present_device(o.device, "--device");
  runner.device = device.str();
  runner.offload_blocks = offload_residency(o.offload, device) == WanWeightResidency::kOffloadBlocks;
  runner.fp8_weights = weights_precision(o.weights, device) == WanWeightPrecision::kFp8;
  runner.fp8_attention = attention_precision(o.attention_dtype, device) == AttentionPrecision::kFp8;
  if (!model.two_experts && !o.transformer_2_file.empty())
    fail_argument("--transformer-2-file", "a model with transformer_2 (Wan 2.2's low-noise expert)", quoted_excerpt(o.transformer_2_file));
  // Absolute: the workers may start in another directory.
  if (!o.transformer_file.empty()) runner.transformer_file = fs::absolute(o.transformer_file).string();
  if (!o.transformer_2_file.empty()) runner.transformer_2_file = fs::absolute(o.transformer_2_file).string();
  runner.sparse_attn_config_json = sparse_config_json(o, flags, width, height);
  if (o.sparse_config_2) {
    const SparseAttnEnv& env = process_sparse_attn_env();
    const SparseAttnConfig first = sparse_attn_requested(flags, env) ? sparse_attn_config_from(flags, env) : SparseAttnConfig{};
    runner.sparse_attn_config_2_json =
        worker_config_json(parse_sparse_attn_config_arg(*o.sparse_config_2, "--sparse-attn-config-2", first), o, width, height);
  }
  runner.sparse_attention_settings = allowed_settings(o, width, height);
  runner.backend_override = backend_override(process_sparse_attn_env());
  runner.plugin_dirs = process_sparse_attn_env().plugin_dirs;
  runner.scheduler = o.scheduler;
  runner.flow_shift = o.flow_shift;
  runner.cache = o.cache;
  runner.cache_config = o.cache_config;
  runner.ulysses = o.ulysses;
  runner.ring = o.ring;
  runner.cfg_parallel = o.cfg_parallel;
  runner.ulysses_head_groups = o.ulysses_head_groups;
  runner.ulysses_sm_margin = o.ulysses_sm_margin;
  check_ulysses_head_groups_flag(o.ulysses_head_groups, o.ulysses_sm_margin, o.ulysses > 1 && o.ring == 1,
                                 detail::concat("ulysses ", o.ulysses, " x ring ", o.ring, " x cfg ", o.cfg_parallel ? 2 : 1));
  const int64_t workers = static_cast<int64_t>(o.ulysses) * o.ring * (o.cfg_parallel ? 2 : 1);
  if (o.num_gpus && *o.num_gpus != workers)
    fail_argument("--num-gpus", detail::concat(workers, ": --ulysses x --ring (x 2 with --cfg-parallel), which say how the ",
                                               "workers split a request"), *o.num_gpus);
  // A group's ranks must step the same requests at every step; they take one request at a time.
  if (o.max_batch && *o.max_batch > 1 && workers > 1)
    fail_argument("--max-batch",
                  detail::concat("1 with a worker group (--ulysses x --ring, x 2 with --cfg-parallel = ", workers,
                                 " workers: its ranks step one request at a time)"),
                  *o.max_batch);
  if (o.cfg_parallel && o.guidance <= 1.0)
    fail_argument("--cfg-parallel", "--guidance above 1 (two branches to split)", o.guidance);
  if (device.is_cuda() && workers > 1 && device.index + workers > cuda_device_count())
    fail_argument("--ulysses x --ring (x 2 with --cfg-parallel)",
                  detail::concat("at most the ", cuda_device_count() - device.index, " GPUs from ", device.str()), workers);

  engine::EngineConfig config;
  config.model_dir = fs::absolute(o.model_dir).string();
  // One Wan model type for every task: WanGenerator runs WanPipeline and WanImageToVideoPipeline directories.
  config.model_type = engine::kWanModelType;
  config.worker_command = {this_executable(), "engine-worker"};
  config.num_workers = static_cast<int>(workers);
  config.max_queue = static_cast<size_t>(o.max_queue);
  config.max_batch = static_cast<int>(o.max_batch.value_or(workers > 1 ? 1 : kDefaultMaxBatch));
  config.batch_join = milliseconds(o.batch_join_ms);
  config.runner_config_json = engine::wan_runner_config_to_json(runner);
  config.request_timeout_auto = o.request_timeout == "auto";
  if (!config.request_timeout_auto) config.request_timeout = seconds(std::stoll(o.request_timeout));
  config.worker_stall_timeout = seconds(o.worker_stall_s);

  engine::WanRequestLimits limits;
  limits.cache = o.cache;
  limits.size_multiple = 2 * model.vae_spatial_stride;
  limits.vae_spatial_stride = model.vae_spatial_stride;
  limits.patch_size = model.transformer.patch_size;
  limits.two_experts = model.two_experts;
  engine::set_image_limits(limits, model);
  // The request ring carries the reference images of an image-to-video model's requests.
  config.max_reference_bytes = limits.takes_image ? o.server.api.max_reference_bytes : 0;
  limits.layout_bound_settings = layout_bound_settings(runner);
  for (const auto& [name, json] : runner.sparse_attention_settings) limits.sparse_attention_settings.push_back(name);
  for (const auto& [name, file] : runner.lora_adapters) limits.lora_adapters.push_back(name);
  engine::ProcessorRegistry processors;
  const engine::WanDeadlineModel deadline_model = engine::wan_deadline_model(model, runner, config.max_batch);
  engine::register_wan_processors(processors, limits, deadline_model);

  o.server.api.model_name = o.served_model_name.empty() ? fs::absolute(o.model_dir).filename().string() : o.served_model_name;
  if (o.server.api.model_name.empty()) o.server.api.model_name = fs::absolute(o.model_dir).parent_path().filename().string();
  o.server.api.default_steps = o.steps;
  o.server.api.default_guidance = o.guidance;
  o.server.api.default_width = width;
  o.server.api.default_height = height;
  o.server.api.default_frames = o.frames;
  o.server.api.default_fps = o.fps;
  o.server.image_timeout = seconds(o.image_timeout_s);
  o.server.keep_alive_timeout = seconds(o.keep_alive_s);

  const sigset_t signals = shutdown_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  engine::Engine engine(config, std::move(processors));
  serve::HttpServer server(engine, o.server);
  const int port = server.bind();
  std::thread watcher([&] {
    int signal_number = 0;
    sigwait(&signals, &signal_number);
    std::fprintf(stderr, "tessel serve: %s: draining (no new requests; running and queued work finishes)\n",
                 strsignal(signal_number));
    engine.scheduler().stop_accepting();
    server.stop();
  });
  watcher.detach();
  std::printf("tessel serve: request timeout: %s\n", request_timeout_summary(config, deadline_model, o.server.api).c_str());
  std::printf("tessel serve: listening on http://%s:%d (model %s, %lld worker(s), queue depth %lld, batch %d)\n",
              o.server.host.c_str(), port, o.server.api.model_name.c_str(), static_cast<long long>(workers),
              static_cast<long long>(o.max_queue), config.max_batch);
  std::fflush(stdout);
  server.run();

  // The listener is closed and every HTTP handler returned; queued video jobs may remain.
  const auto deadline = std::chrono::steady_clock::now() + seconds(o.drain_timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    const engine::SchedulerCounts counts = engine.scheduler().counts();
    if (counts.queued == 0 && counts.running == 0) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  const engine::SchedulerCounts left = engine.scheduler().counts();
  const bool drained = left.queued == 0 && left.running == 0;
  engine.shutdown(drained ? engine::ShutdownMode::kDrain : engine::ShutdownMode::kCancel);
  const engine::SchedulerCounts final_counts = engine.scheduler().counts();
  std::fprintf(stderr, "tessel serve: stopped (%s; succeeded %lld, failed %lld, cancelled %lld, rejected %lld)\n",
               drained ? "drained" : "drain timeout: the rest was cancelled", static_cast<long long>(final_counts.succeeded),
               static_cast<long long>(final_counts.failed), static_cast<long long>(final_counts.cancelled),
               static_cast<long long>(final_counts.rejected_queue_full));
  return 0;
}

CommandRegistration registration{
    "serve", "HTTP server (OpenAI-style image and video API) over the diffusion engine and its worker processes",
    [](CLI::App& app) {
      auto o = std::make_shared<ServeOptions>();
      auto flags = std::make_shared<SparseAttnFlags>();
      app.add_option("--model", o->model_dir, "diffusers WanPipeline directory (model_index.json, transformer/, scheduler/)")
          ->required();
      app.add_option("--sparse-attn-config-2", o->sparse_config_2,
                     "Wan 2.2 two-expert models: the low-noise expert's (transformer_2) sparse config, JSON or @file.json, "
                     "over the first expert's (default: the same)");
      app.add_option("--embeddings", o->embeddings,
                     "safetensors with prompt_embeds (and negative_prompt_embeds): the text conditioning of every request")
          ->check(non_empty_path());
      app.add_option("--host", o->server.host, "address to listen on")
          ->capture_default_str()
          ->check(CLI::Validator([](std::string& text) { return text.empty() ? std::string("expected an address, got ''") : std::string(); },
                                 "an address", "HOST"));
      app.add_option("--port", o->server.port, "port (0: any free one, printed)")->capture_default_str()->check(integer_in(0, 65535));
      app.add_option("--max-queue", o->max_queue, "requests that may wait; beyond: 429")->capture_default_str()->check(integer_in(1, 100000));
      app.add_option("--max-batch", o->max_batch,
                     "requests in flight on the workers at once, stepped together (default 8; 1: one at a time; a worker "
                     "group takes 1 only)")
          ->check(integer_in(1, 64));
      app.add_option("--batch-join-ms", o->batch_join_ms,
                     "milliseconds an idle worker waits for more requests before the first step of a new batch")
          ->capture_default_str()
          ->check(integer_in(0, 10000));
      app.add_option("--api-key", o->server.api_key, "require Authorization: Bearer KEY (all but /health)");
      app.add_option("--num-gpus", o->num_gpus,
                     "worker processes, one per GPU of the parallel group (default and only value: --ulysses x --ring, x 2 "
                     "with --cfg-parallel)")
          ->check(integer_in(1, 64));
      app.add_option("--ulysses", o->ulysses, "Ulysses sequence-parallel degree of the worker group (divides the heads)")
          ->capture_default_str()
          ->check(integer_in(1, 64));
      app.add_option("--ring", o->ring, "Ring sequence-parallel degree of the worker group")->capture_default_str()->check(integer_in(1, 64));
      app.add_flag("--cfg-parallel", o->cfg_parallel, "the two guidance branches on two workers");
      app.add_option("--ulysses-head-groups", o->ulysses_head_groups,
                     "Ulysses alone: pipeline its all-to-alls with the attention in this many groups of each worker's heads "
                     "(divides them; changes timing only)")
          ->capture_default_str()
          ->check(integer_in(1, 1024));
      app.add_option("--ulysses-sm-margin", o->ulysses_sm_margin,
                     "with --ulysses-head-groups: multiprocessors each group's attention leaves to the all-to-alls beside it "
                     "(changes timing only)")
          ->capture_default_str()
          ->check(integer_in(0, 1024));
      app.add_option("--threads", o->threads, "CPU threads per worker (default: all)")->check(integer_in(1, 4096));
      app.add_option("--device", o->device,
                     "where each worker runs the transformer and the text encoder: cpu (fp32) or cuda[:N] (bf16)")
          ->capture_default_str()
          ->check(device_name());
      app.add_option("--served-model-name", o->served_model_name, "the model id of /v1/models (default: the directory's name)");
      app.add_option("--size", o->size, "default WIDTHxHEIGHT of a request")->capture_default_str()
          ->check(width_height());
      app.add_option("--frames", o->frames, "default video frames (4k + 1)")->capture_default_str()->check(integer_in(1, 1 << 16));
      app.add_option("--steps", o->steps, "default denoising steps")->capture_default_str()->check(integer_in(1, 100000));
      app.add_option("--guidance", o->guidance, "default guidance scale")->capture_default_str()->check(number_in(0.0, 1000.0));
      app.add_option("--fps", o->fps, "default video frame rate")->capture_default_str()->check(number_in(1.0, 120.0));
      app.add_option("--scheduler", o->scheduler, "unipc or euler (default: the model's scheduler/)")->check(one_of({"unipc", "euler"}));
      app.add_option("--flow-shift", o->flow_shift, "the schedule's shift (default: the scheduler config's)")
          ->check(number_in(0.0, 1000.0, Bounds::kOpenLow));
      app.add_option("--request-timeout", o->request_timeout,
                     "seconds a request may run, from its start, before it is stopped and fails: auto (each request's own deadline, "
                     "sized from the model and the request), or a number for every request (0: no limit)")
          ->capture_default_str()
          ->check(request_timeout_value());
      app.add_option("--image-timeout", o->image_timeout_s, "seconds an images request waits for its images (then 504)")
          ->capture_default_str()
          ->check(integer_in(1, 1 << 24));
      app.add_option("--worker-stall-timeout", o->worker_stall_s,
                     "seconds a worker may go without a heartbeat (stopped, hung) before its request fails and the workers restart")
          ->capture_default_str()
          ->check(integer_in(2, 86400));
      app.add_option("--drain-timeout", o->drain_timeout_s, "seconds queued work may take after SIGTERM before it is cancelled")
          ->capture_default_str()
          ->check(integer_in(0, 1 << 24));
      app.add_option("--max-body-bytes", o->server.max_body_bytes, "largest request body (beyond: 413)")
          ->capture_default_str()
          ->check(integer_in(1024, 1 << 30));
      app.add_option("--max-connections", o->server.max_connections,
                     "HTTP connections served at once, each on its own thread (the next 64: 503 at once)")
          ->capture_default_str()
          ->check(integer_in(16, 65536));
      app.add_option("--keep-alive-timeout", o->keep_alive_s, "seconds an idle keep-alive connection stays open")
          ->capture_default_str()
          ->check(integer_in(1, 3600));
      add_sparse_attn_flags(app, *flags);
      add_cache_flags(app, o->cache, o->cache_config, " (a request may ask for none)");
      app.add_option("--sparse-attn-allow", o->sparse_attention_allowed,
                     "NAME=dense|'<json>'|@file.json: a sparse-attention setting requests may ask for by name (repeatable)");
      auto lora = std::make_shared<LoraFlags>();
      add_lora_flags(app, *lora);
      add_lora_adapter_flag(app, *lora);
      add_offload_flag(app, o->offload);
      add_weights_flag(app, o->weights);
      add_attention_dtype_flag(app, o->attention_dtype);
      add_transformer_file_flags(app, o->transformer_file, &o->transformer_2_file);
      return CommandRunner([o, flags, lora] { return run_serve(*o, *flags, *lora); });
    }};

}  // namespace
}  // namespace tessel::cli
