// `tessel vae-bench`: times WanVae::decode (the Wan 2.1 VAE at its real sizes, or the tiny preset,
// with random weights: the time does not depend on their values; or a diffusers vae/ directory) on
// the CPU or a CUDA device, and reports the device memory the decoder holds; with --encode it times
// WanVae::encode of a random video instead, on the CPU or a CUDA device. 480p 81 frames are
// latents of 21 x 60 x 104. With --latents and --save-video it decodes given latents and writes the
// video, for a comparison with diffusers on the same weights (bench/diffusers_vae_decode.py --parity).
// Under --ulysses / --ring (--cfg-parallel) the decode is split by height over the sequence group, as
// `generate` splits it (mpirun on the CPU; one process per GPU, NCCL, with mpirun or the TESSEL_*
// environment), and --check compares the whole video with this rank's decode alone.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "device_memory.h"
#include "option_checks.h"
#include "parallel_flags.h"
#include "quality/output_error.h"
#include "work_budget.h"
#include "tessel/core/error.h"
#include "tessel/core/exec_context.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/wan_vae.h"
#include "tessel/diffusion/wan_vae_memory.h"
#include "tessel/core/finite_check.h"

namespace tessel::cli {
namespace {

struct VaeBenchOptions {
  std::string device = "cuda";
  std::string preset = "wan2.1";
  int64_t frames = 81, height = 480, width = 832;
  int64_t iters = 3, warmup = 1;
  int64_t threads = 0;
  bool no_tf32 = false;
  bool json = false;
  std::string from_dir;    // a diffusers vae/ directory instead of random weights
  std::string latents;     // safetensors holding "latents" (1, z_dim, T, h, w) instead of random ones
  std::string save_video;  // safetensors to write the last decode's "video" to
  bool encode = false;     // time WanVae::encode of a random video instead
  bool check = false;      // a split decode's video against this rank's whole-frame decode
  BudgetFlags budget;
};

// The shape of a --latents file's "latents", read from its header (no data) and checked:
// (1, z_dim, T, h, w).
Shape latents_file_shape(const std::string& path, const WanVaeConfig& config) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  const SafetensorsEntry* latents = file.find("latents");
  if (latents == nullptr) fail_argument("--latents", "a safetensors file with a tensor \"latents\"", quoted_excerpt(path));
  if (latents->shape.size() != 5 || latents->shape[0] != 1 || latents->shape[1] != config.z_dim)
    fail_argument("--latents " + quoted_excerpt(path) + ": tensor latents", detail::concat("(1, ", config.z_dim, " (the VAE's z_dim), T, h, w)"),
                  shape_str(latents->shape));
  for (size_t d = 2; d < 5; ++d)
    if (latents->shape[d] < 1 || latents->shape[d] > (1 << 16))
      fail_argument("--latents " + quoted_excerpt(path) + ": tensor latents", "frames, height and width in [1, 65536]",
                    shape_str(latents->shape));
  return latents->shape;
}

// --from-dir's config.json.
WanVaeConfig read_vae_config(const std::string& directory) {
  const std::string path = directory + "/config.json";
  return parse_wan_vae_config(read_file_bounded(path, 1 << 20, "--from-dir config.json"), path);
}

// Memory and time of the bench before the VAE is built: the weights (both halves, as the bench builds
// them) while they are made and once built, then per call the activations (wan_vae_memory.h), the
// latents and the video on the host (CPU) or the device, times --warmup + --iters calls.
WorkEstimate vae_bench_estimate(const VaeBenchOptions& o, const WanVaeConfig& config, const Shape& input, Device device) {
  const WanVaeHostWeights weights = wan_vae_host_weight_bytes(config, WanVaeParts::kDecoderAndEncoder);
  const WanVaeCost cost = o.encode ? wan_vae_encode_cost(config, input) : wan_vae_decode_cost(config, input, device);
  const double io = 4.0 * static_cast<double>(shape_numel(input)) + cost.output_bytes;
  WorkEstimate e;
  if (device.is_cuda()) {
    e.device_bytes = wan_vae_device_weight_bytes(config) + cost.activation_bytes + io;
    e.host_bytes = std::max(weights.building, weights.held + io);
  } else {
    e.host_bytes = std::max(weights.building, weights.held + cost.activation_bytes + io);
  }
  e.flop = cost.flop * static_cast<double>(o.warmup + o.iters);
  return e;
}

// The latents of --frames x --height x --width: (1, z_dim, (frames - 1) / 4 + 1, height / 8, width / 8).
Shape latent_size(const VaeBenchOptions& o, const WanVaeConfig& config) {
  require_multiple("--height", o.height, "the VAE's spatial factor", 8);
  require_multiple("--width", o.width, "the VAE's spatial factor", 8);
  if ((o.frames - 1) % 4 != 0) fail_argument("--frames", "4k + 1 (the VAE's temporal factor is 4)", o.frames);
  return {1, config.z_dim, (o.frames - 1) / 4 + 1, o.height / 8, o.width / 8};
}

// The latents to decode: the file's, or seeded random ones of the video size asked for.
Tensor bench_latents(const VaeBenchOptions& o, const WanVaeConfig& config) {
  if (!o.latents.empty()) {
    latents_file_shape(o.latents, config);
    Tensor latents = SafetensorsFile::open(o.latents).load("latents");
    check_finite(latents, "--latents " + quoted_excerpt(o.latents) + ": tensor latents");
    return latents;
  }
  Tensor latents = Tensor::empty(latent_size(o, config), DType::kF32);
  fill_normal(latents.view(), 7);
  return latents;
}

// The sorted seconds of o.iters timed calls of `run`, after o.warmup untimed ones.
std::vector<double> timed_runs(const VaeBenchOptions& o, const std::function<void()>& run) {
  std::vector<double> seconds;
  for (int64_t i = 0; i < o.warmup + o.iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i >= o.warmup) seconds.push_back(elapsed);
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds;
}

// --encode's video (1, colours, --frames, --height, --width): its sizes checked against the VAE.
Shape encode_video_shape(const VaeBenchOptions& o, const WanVaeConfig& config) {
  require_multiple("--height", o.height, "the VAE's spatial factor", config.spatial_compression());
  require_multiple("--width", o.width, "the VAE's spatial factor", config.spatial_compression());
  if ((o.frames - 1) % 4 != 0) fail_argument("--frames", "4k + 1 (the encoder takes the first frame, then chunks of 4)", o.frames);
  return {1, config.in_channels / (config.patch_size * config.patch_size), o.frames, o.height, o.width};
}

// --encode: WanVae::encode of a seeded random video of the size asked for, on ctx's device (the
// video goes up once, before the timed encodes).
int run_encode_bench(const VaeBenchOptions& o, const WanVae& vae, const ExecContext& ctx, const WorkEstimate& estimate,
                     const std::optional<DeviceMemory>& memory_before) {
  const WanVaeConfig& config = vae.config();
  Tensor video = Tensor::empty(encode_video_shape(o, config), DType::kF32);
  fill_normal(video.view(), 7, 0.0, 0.5);
  video = video.to(ctx.device);
  Tensor mu = Tensor::empty(vae.encoded_shape(video.shape()), DType::kF32, ctx.device);
  const std::vector<double> seconds = timed_runs(o, [&] { vae.encode(ctx, video, mu); });  // returns when the device has finished
  const std::optional<DeviceMemory> memory_after = device_memory(ctx.device);
  const double median = seconds[seconds.size() / 2];
  nlohmann::json report = {{"preset", o.from_dir.empty() ? o.preset : o.from_dir},
                           {"device", ctx.device.str()},
                           {"precision", ctx.device.is_cuda() && !o.no_tf32 ? "fp32 (TF32 convolutions)" : "fp32"},
                           {"video", video.shape()},
                           {"latents", mu.shape()},
                           {"iters", o.iters},
                           {"median_s", median},
                           {"min_s", seconds.front()},
                           {"per_frame_ms", median * 1000.0 / static_cast<double>(o.frames)},
                           {"estimated_host_memory_bytes", estimate.host_bytes},
                           {"peak_host_memory_bytes", peak_host_memory_bytes()}};
  // The encoder's weights, the video and mu, and what cuDNN took (the encoder gives its
  // activations back after each encode).
  if (memory_before && memory_after) report["device_memory_bytes"] = memory_after->used - memory_before->used;
  if (o.json) {
    std::printf("%s\n", report.dump().c_str());
    return 0;
  }
  std::printf("Wan VAE encode (%s, %s, %s): video %s -> latents %s: median %.3f s (min %.3f s, %.1f ms per frame) over %lld runs; "
              "peak host memory %s (estimated %s)",
              report["preset"].get<std::string>().c_str(), ctx.device.str().c_str(), report["precision"].get<std::string>().c_str(),
              shape_str(video.shape()).c_str(), shape_str(mu.shape()).c_str(), median, seconds.front(),
              report["per_frame_ms"].get<double>(), static_cast<long long>(o.iters), format_bytes(peak_host_memory_bytes()).c_str(),
              format_bytes(estimate.host_bytes).c_str());
  if (report.contains("device_memory_bytes"))
    std::printf(", device memory held %s", format_bytes(report["device_memory_bytes"].get<double>()).c_str());
  std::printf("\n");
  return 0;
}

// --check's bound on the rel-L2 of a split decode against the whole-frame one: on the CPU each pixel
// is the same sum (bit-equal); on CUDA a band's convolutions are cuDNN calls of other heights, whose
// algorithms may round otherwise (1e-4 in fp32, 1e-2 with TF32, as wan_vae_split_gpu_test.cc).
double split_tolerance(Device device, bool tf32) { return device.is_cpu() ? 0.0 : tf32 ? 1e-2 : 1e-4; }

int run_vae_bench(const VaeBenchOptions& o, const ParallelFlags& parallel) {
  const Device asked = budget_device(o.budget, o.device, "--device");
  const bool split = parallel.ulysses * parallel.ring * (parallel.cfg_parallel ? 2 : 1) > 1;
  if (o.encode && split) fail_argument("--encode", "a run of one rank (only the decode splits over --ulysses / --ring)", parallel.describe());
  // The config (and the shapes) first: the budget is checked before any weight is made or read.
  const std::optional<WanVaeConfig> from_dir_config = o.from_dir.empty() ? std::nullopt : std::optional(read_vae_config(o.from_dir));
  const WanVaeConfig config = from_dir_config   ? *from_dir_config
                              : o.preset == "tiny"   ? tiny_wan_vae_config()
                              : o.preset == "wan2.2" ? wan22_vae_config()
                                                     : WanVaeConfig{};
  const Shape input = o.encode ? encode_video_shape(o, config) : !o.latents.empty() ? latents_file_shape(o.latents, config) : latent_size(o, config);
  const WorkEstimate estimate = vae_bench_estimate(o, config, input, asked);
  const std::string shape_flags = (!o.latents.empty() ? "--latents " + quoted_excerpt(o.latents)
                                                      : detail::concat("--frames ", o.frames, " --height ", o.height, " --width ", o.width)) +
                                  detail::concat(" --iters ", o.iters, " --warmup ", o.warmup);
  if (!check_work_budget(estimate, o.budget, asked, static_cast<int>(o.threads), shape_flags,
                         o.encode ? "vae-bench --encode" : "vae-bench"))
    return 0;
  // Several ranks: each on its local GPU; the decode's group is the sequence group.
  ParallelRun run(parallel, asked);
  const Device device = run.device();
  Communicator* group = run.groups() != nullptr ? run.groups()->sequence.get() : nullptr;
  if (o.check && group == nullptr)
    fail_argument("--check", "a split decode (--ulysses / --ring, or the TESSEL_* environment)", "one process");
  ExecContext ctx;
  ctx.device = device;
  ctx.num_threads = static_cast<int>(o.threads);

  const std::optional<DeviceMemory> memory_before = device_memory(device);
  WanVae vae = o.from_dir.empty() ? WanVae(config, random_model_weights(wan_vae_weight_specs(config), 1)) : WanVae::load(o.from_dir);
  vae.set_cuda_tf32(!o.no_tf32);
  if (o.encode) return run_encode_bench(o, vae, ctx, estimate, memory_before);
  const Tensor latents = bench_latents(o, vae.config()).to(device);
  const Shape latent_shape = latents.shape();
  Tensor video = Tensor::empty(vae.decoded_shape(latent_shape), DType::kF32, device);

  // Returns when the device has finished.
  const std::vector<double> seconds = timed_runs(o, [&] { vae.decode(ctx, latents, video, nullptr, group); });
  const std::optional<DeviceMemory> memory_after = device_memory(device);
  if (!run.is_root()) return 0;  // every rank has the whole video: the root reports it
  if (!o.save_video.empty()) {
    const Tensor host_video = video.to(Device::cpu());
    write_safetensors(o.save_video, {{"video", host_video.view()}}, {{"format", "pt"}});
  }
  const double median = seconds[seconds.size() / 2];

  nlohmann::json report = {{"preset", o.from_dir.empty() ? o.preset : o.from_dir},
                           {"device", device.str()},
                           {"precision", device.is_cuda() && !o.no_tf32 ? "fp32 (TF32 convolutions)" : "fp32"},
                           {"latents", latent_shape},
                           {"video", video.shape()},
                           {"iters", o.iters},
                           {"median_s", median},
                           {"min_s", seconds.front()},
                           {"per_frame_ms", median * 1000.0 / static_cast<double>(video.size(2))}};
  // The decoder's weights, the buffers it keeps for the next decode and what cuDNN took.
  if (memory_before && memory_after) report["device_memory_bytes"] = memory_after->used - memory_before->used;
  if (device.is_cuda()) report["estimated_device_memory_bytes"] = estimate.device_bytes;
  report["estimated_host_memory_bytes"] = estimate.host_bytes;
  report["peak_host_memory_bytes"] = peak_host_memory_bytes();
  bool check_pass = true;
  if (group != nullptr) {
    report["split_ranks"] = group->size();
    report["parallel"] = parallel.describe();
  }
  if (o.check) {
    // This rank's decode alone, after the timed ones (the same decoder and weights).
    const Tensor whole = vae.decode(ctx, latents).to(Device::cpu());
    const double error = compare_outputs(video.to(Device::cpu()), whole).rel_l2;
    const double tolerance = split_tolerance(device, !o.no_tf32);
    check_pass = error <= tolerance;
    report["rel_l2_vs_one_rank"] = error;
    report["check_tolerance"] = tolerance;
    report["check_pass"] = check_pass;
  }
  if (o.json) {
    std::printf("%s\n", report.dump().c_str());
    return check_pass ? 0 : 1;
  }
  std::printf("Wan VAE decode (%s, %s, %s): latents (1, %lld, %lld, %lld, %lld) -> video (1, 3, %lld, %lld, %lld): median %.3f s "
              "(min %.3f s, %.1f ms per frame) over %lld runs",
              o.preset.c_str(), device.str().c_str(), report["precision"].get<std::string>().c_str(),
              static_cast<long long>(latent_shape[1]), static_cast<long long>(latent_shape[2]), static_cast<long long>(latent_shape[3]),
              static_cast<long long>(latent_shape[4]), static_cast<long long>(video.size(2)), static_cast<long long>(video.size(3)),
              static_cast<long long>(video.size(4)), median, seconds.front(), report["per_frame_ms"].get<double>(),
              static_cast<long long>(o.iters));
  if (report.contains("device_memory_bytes"))
    std::printf(", device memory held %s (estimated %s)", format_bytes(report["device_memory_bytes"].get<double>()).c_str(),
                format_bytes(estimate.device_bytes).c_str());
  std::printf("; peak host memory %s (estimated %s)\n", format_bytes(peak_host_memory_bytes()).c_str(), format_bytes(estimate.host_bytes).c_str());
  if (group != nullptr) std::printf("split by height over %d ranks (%s)\n", group->size(), parallel.describe().c_str());
  if (o.check)
    std::printf("check: rel-L2 %.3g against this rank's whole-frame decode (tolerance %g): %s\n", report["rel_l2_vs_one_rank"].get<double>(),
                report["check_tolerance"].get<double>(), check_pass ? "ok" : "FAIL");
  return check_pass ? 0 : 1;
}

CommandRegistration registration{
    "vae-bench", "Time the Wan VAE decoder or encoder (random weights: Wan 2.1 or 2.2 sizes, or tiny) on the CPU or a CUDA device",
    [](CLI::App& app) {
      auto options = std::make_shared<VaeBenchOptions>();
      app.add_option("--device", options->device, "cpu or cuda[:N] (fp32; convolutions may use TF32 on CUDA)")
          ->capture_default_str()
          ->check(device_name());
      auto* preset = app.add_option("--preset", options->preset,
                                    "wan2.1 or wan2.2 (the real VAEs' sizes; Wan 2.2's: 16 pixels per latent pixel) or tiny, random weights")
                         ->capture_default_str()
                         ->check(one_of({"wan2.1", "wan2.2", "tiny"}));
      app.add_option("--from-dir", options->from_dir, "a diffusers AutoencoderKLWan directory (vae/) instead of --preset")->excludes(preset);
      auto* latents = app.add_option("--latents", options->latents,
                                     "safetensors file with the tensor 'latents' (1, z_dim, T, h, w) to decode instead of random ones");
      app.add_option("--save-video", options->save_video, "write the last decode's video (fp32, tensor 'video') to this safetensors file")
          ->check(non_empty_path());
      app.add_option("--frames", options->frames, "video frames, 4k + 1 (latent frames: k + 1)")->capture_default_str()->check(integer_in(1, 1 << 16));
      app.add_option("--height", options->height, "video height in pixels (latent: / 8, or / 16 for Wan 2.2's VAE)")
          ->capture_default_str()
          ->check(integer_in(8, 1 << 16));
      app.add_option("--width", options->width, "video width in pixels (latent: / 8, or / 16 for Wan 2.2's VAE)")
          ->capture_default_str()
          ->check(integer_in(8, 1 << 16));
      for (const char* shaped : {"--frames", "--height", "--width"}) app.get_option(shaped)->excludes(latents);
      app.add_option("--iters", options->iters, "timed decodes (the median is reported)")->capture_default_str()->check(integer_in(1, kMaxRepeats));
      app.add_option("--warmup", options->warmup, "untimed decodes first (the first uploads the weights to the device)")
          ->capture_default_str()
          ->check(integer_in(0, kMaxRepeats));
      app.add_option("--threads", options->threads, "CPU threads (default: all)")->check(integer_in(1, kMaxThreads));
      CLI::Option* no_tf32 = app.add_flag("--no-tf32", options->no_tf32, "keep every product of the CUDA convolutions in fp32 (no TF32)");
      app.add_flag("--json", options->json, "print one JSON object instead of a line");
      CLI::Option* encode = app.add_flag("--encode", options->encode,
                                         "time the encoder (WanVae::encode) on a random video of --frames x --height x --width");
      encode->excludes(latents)->excludes("--save-video");
      app.add_flag("--check", options->check,
                   "with --ulysses / --ring: compare the split decode's video with this rank's whole-frame decode "
                   "(rel-L2; exit status 1 above the tolerance)");
      auto parallel = std::make_shared<ParallelFlags>();
      add_parallel_flags(app, *parallel);
      add_budget_flags(app, options->budget);
      return CommandRunner([options, no_tf32, parallel] {
        check_applies(no_tf32, options->device.rfind("cuda", 0) == 0, "--device cuda");
        return run_vae_bench(*options, *parallel);
      });
    }};

}  // namespace
}  // namespace tessel::cli
