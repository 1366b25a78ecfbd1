// `tessel dit-bench`: times denoising steps of the Wan transformer (random weights of a named size,
// or a diffusers checkpoint directory) with dense or sparse self-attention, on the CPU (fp32) or a
// CUDA device (bf16), and reports where the time goes and, on CUDA, the device memory it took.
// Under --ulysses / --ring / --cfg-parallel (mpirun, or the TESSEL_* environment on GPUs) every rank
// runs its shard of the tokens and its guidance branch; the step time and the communication are
// reported, and --check compares the whole output with the one-process forward's. A model with
// Wan 2.1 I2V's image branch (--model wan-i2v-14b, or such a checkpoint) also takes CLIP features:
// random ones of --image-tokens tokens (FLF2V: its position table's), or the --inputs file's.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_timer.h"
#include "command.h"
#include "device_memory.h"
#include "offload_flags.h"
#include "weights_flags.h"
#include "attention_dtype_flag.h"
#include "option_checks.h"
#include "parallel_flags.h"
#include "work_budget.h"
#include "sparse_attn_flags.h"
#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/io/limited_json.h"
#include "tessel/core/exec_context.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/dit/wan_lora_bank.h"
#include "tessel/dit/wan_model.h"
#include "tessel/dit/wan_weights.h"
#include "tessel/kernels/attention_tuning.h"
#include "tessel/parallel/cfg_parallel.h"
#include "tessel/sparse/registry.h"
#include "tessel/core/finite_check.h"

namespace tessel::cli {
namespace {

// Wan's VAE: 4x in time (the first frame alone), 8x in height and width.
constexpr int64_t kVaeTimeStride = 4;
constexpr int64_t kVaeSpaceStride = 8;

struct DitBenchOptions {
  std::string device = "cpu";
  std::string model = "wan-1.3b";
  std::string from_dir;
  int64_t frames = 81, height = 480, width = 832;
  int64_t batch = 2;  // classifier-free guidance: conditional and unconditional in one call
  int64_t text_tokens = 512;
  int64_t image_tokens = 257;  // CLIP ViT-H/14's 16 x 16 patches and class token (an image branch only)
  int64_t layers = 0;  // 0: the model's
  int64_t steps = 1, warmup = 0;
  int64_t threads = 0;
  int64_t seed = 0;
  bool json = false;
  bool compare_dense = false;
  bool check = false;  // the whole output against the one-process forward (parallel runs)
  std::string layer_configs;  // '<json>' or '@file.json': {"<block>": {config fields}, ...}
  std::string inputs;         // safetensors with the forward's inputs instead of random ones
  std::string save_output;    // safetensors to write the last timed step's output to
  std::string offload = "none";
  std::string weights = "bf16";
  std::string attention_dtype = "bf16";
  std::string attention_kernel_variant;  // empty: the tuned or default one
  std::string transformer_file;
  double device_memory_limit_gib = 0.0;  // > 0: the run sees a card of this many GiB
  // Per-request LoRA: random adapters of this rank on every linear layer (0: none), the batch's
  // entries split into lora_adapters contiguous groups, group i using adapter i.
  int64_t lora_rank = 0, lora_adapters = 1;
  BudgetFlags budget;
};

constexpr uint64_t kMaxLayerConfigBytes = 1 << 20;

// --sparse-attn-layers: each block's fields on top of the command's whole config (`base`).
std::map<int64_t, SparseAttnConfig> parse_layer_configs(const std::string& arg, const SparseAttnConfig& base, int64_t num_layers) {
  const std::string flag = "--sparse-attn-layers";
  const std::string text = arg.rfind('@', 0) == 0 ? read_file_bounded(arg.substr(1), kMaxLayerConfigBytes, flag + " file after '@'") : arg;
  const nlohmann::json json = parse_json_limited(text, JsonLimits{}, flag);
  if (!json.is_object()) fail_argument(flag, "a JSON object of block index -> config fields", json_excerpt(json));
  std::map<int64_t, SparseAttnConfig> configs;
  for (const auto& [key, value] : json.items()) {
    int64_t layer = -1;
    const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), layer);
    if (error != std::errc{} || end != key.data() + key.size() || layer < 0 || layer >= num_layers)
      fail_argument(flag + " key", detail::concat("a block index in [0, ", num_layers, ")"), quoted_excerpt(key));
    if (!value.is_object()) fail_argument(flag + "[" + key + "]", "an object of config fields", json_excerpt(value));
    try {
      configs[layer] = parse_sparse_attn_json(value.dump(), base);
    } catch (const Error& e) {
      throw Error(flag + "[" + key + "]: " + e.what());
    }
  }
  return configs;
}

struct LatentShape {
  int64_t frames, height, width;
};

LatentShape latent_shape(const DitBenchOptions& o, const WanConfig& config) {
  if ((o.frames - 1) % kVaeTimeStride != 0)
    fail_argument("--frames", detail::concat("4k + 1 video frames (Wan's VAE keeps the first frame and every ", kVaeTimeStride, "th after)"),
                  o.frames);
  const int64_t pixels_per_patch_h = kVaeSpaceStride * config.patch_size[1], pixels_per_patch_w = kVaeSpaceStride * config.patch_size[2];
  if (o.height % pixels_per_patch_h != 0) fail_argument("--height", detail::concat("a multiple of ", pixels_per_patch_h, " pixels"), o.height);
  if (o.width % pixels_per_patch_w != 0) fail_argument("--width", detail::concat("a multiple of ", pixels_per_patch_w, " pixels"), o.width);
  const LatentShape latent{(o.frames - 1) / kVaeTimeStride + 1, o.height / kVaeSpaceStride, o.width / kVaeSpaceStride};
  if (latent.frames % config.patch_size[0] != 0)
    fail_argument("--frames", detail::concat("a latent frame count that is a multiple of the patch's ", config.patch_size[0]), latent.frames);
  return latent;
}

// The named sizes: the dit layer's text-to-video presets and Wan2.1-I2V-14B's.
constexpr const char* kI2vPreset = "wan-i2v-14b";
std::vector<std::string> bench_presets() {
  std::vector<std::string> names = wan_preset_names();
  names.push_back(kI2vPreset);
  return names;
}
WanConfig bench_preset(const std::string& name) { return name == kI2vPreset ? wan_i2v_14b_transformer_config() : wan_preset(name); }

// The forward's inputs, on the host: random ones of the options' shapes, or a file's.
struct BenchInputs {
  int64_t batch = 0, text_tokens = 0;
  LatentShape latent{};
  Tensor latents, text;
  Tensor image;     // the CLIP features of a model with an image branch (undefined without one)
  Tensor timestep;  // from the file (every step uses it); undefined: the schedule's per step
};

// The shapes are known first; random inputs are made by make_random_inputs, after the budget check.
BenchInputs bench_inputs(const DitBenchOptions& o, const WanConfig& config) {
  BenchInputs in;
  if (o.inputs.empty()) {
    in.batch = o.batch;
    in.text_tokens = o.text_tokens;
    in.latent = latent_shape(o, config);
    return in;
  }
  const SafetensorsFile file = SafetensorsFile::open(o.inputs);
  const auto load = [&](const char* name) {
    if (file.find(name) == nullptr) fail_argument("--inputs", detail::concat("a tensor named ", name), "none in " + quoted_excerpt(o.inputs));
    Tensor tensor = file.load(name).to(DType::kF32);
    check_finite(tensor, "--inputs " + quoted_excerpt(o.inputs) + ": tensor " + name);
    return tensor;
  };
  in.latents = load("hidden_states");
  in.timestep = load("timestep");
  in.text = load("encoder_hidden_states");
  check_rank(in.latents, 5, "--inputs hidden_states");
  in.batch = in.latents.size(0);
  in.latent = {in.latents.size(2), in.latents.size(3), in.latents.size(4)};
  check_shape(in.latents, {in.batch, config.in_channels, in.latent.frames, in.latent.height, in.latent.width}, "--inputs hidden_states");
  check_shape(in.timestep, {in.batch}, "--inputs timestep");
  check_rank(in.text, 3, "--inputs encoder_hidden_states");
  in.text_tokens = in.text.size(1);
  check_shape(in.text, {in.batch, in.text_tokens, config.text_dim}, "--inputs encoder_hidden_states");
  if (config.has_image_branch()) {
    in.image = load("encoder_hidden_states_image");
    check_rank(in.image, 3, "--inputs encoder_hidden_states_image");
    check_shape(in.image, {in.batch, in.image.size(1), config.image_dim}, "--inputs encoder_hidden_states_image");
  }
  return in;
}

void make_random_inputs(const DitBenchOptions& o, const WanConfig& config, BenchInputs& in) {
  if (in.latents.defined()) return;  // --inputs
  in.latents = Tensor::empty({in.batch, config.in_channels, in.latent.frames, in.latent.height, in.latent.width}, DType::kF32);
  in.text = Tensor::empty({in.batch, in.text_tokens, config.text_dim}, DType::kF32);
  fill_normal(in.latents.view(), static_cast<uint64_t>(o.seed) + 1);
  fill_normal(in.text.view(), static_cast<uint64_t>(o.seed) + 2);
  if (config.has_image_branch()) {
    // FLF2V takes exactly its position table's tokens (the first and the last image's).
    const int64_t tokens = config.pos_embed_seq_len > 0 ? config.pos_embed_seq_len : o.image_tokens;
    in.image = Tensor::empty({in.batch, tokens, config.image_dim}, DType::kF32);
    fill_normal(in.image.view(), static_cast<uint64_t>(o.seed) + 3);
  }
}

double rel_l2(const Tensor& actual, const Tensor& expected) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    const double d = static_cast<double>(actual.data_as<float>()[i]) - expected.data_as<float>()[i];
    diff += d * d;
    norm += static_cast<double>(expected.data_as<float>()[i]) * expected.data_as<float>()[i];
  }
  return std::sqrt(diff / norm);
}

// Entry `index` of the first (batch) dimension of a contiguous host tensor, as a batch of one.
Tensor batch_entry(const Tensor& host, int64_t index) {
  Shape shape = host.shape();
  shape[0] = 1;
  Tensor entry = Tensor::empty(shape, host.dtype());
  std::memcpy(entry.data(), static_cast<const char*>(host.data()) + index * entry.nbytes(), entry.nbytes());
  return entry;
}

// A step's timesteps on the host: the file's, else the schedule's value for every batch entry.
Tensor step_timestep(const BenchInputs& in, int64_t batch, int64_t step, int64_t total_steps) {
  if (in.timestep.defined()) return in.timestep;
  Tensor timestep = Tensor::empty({batch}, DType::kF32);
  // A flow-matching schedule's timesteps fall from 1000 towards 0.
  fill(timestep.view(), 1000.0 * (1.0 - static_cast<double>(step) / static_cast<double>(total_steps)));
  return timestep;
}

// What a parallel run's whole output may differ from one process's by (relative L2): fp32 is
// reordered sums only; bf16 GEMMs of other row counts may pick other algorithms and round
// differently, and Ring merges partial outputs.
double parallel_tolerance(Device device) { return device.is_cuda() ? 2e-2 : 1e-5; }

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Memory and time of the bench, one rank's share (its guidance branch, its shard of the tokens):
// the weights (CPU fp32, CUDA bf16), one forward's activations, and with --compare-dense or --check a
// forward of the whole batch in one process beside them (CUDA: with its own workspace; the CPU's
// activations are made per call); --warmup + --steps forwards.
WorkEstimate dit_bench_estimate(const DitBenchOptions& o, const WanConfig& config, const BenchInputs& in, const ParallelFlags& parallel,
                                Device device) {
  const double tokens = static_cast<double>(in.latent.frames / config.patch_size[0] * (in.latent.height / config.patch_size[1]) *
                                            (in.latent.width / config.patch_size[2]));
  const double shards = static_cast<double>(parallel.ulysses * parallel.ring), batch = static_cast<double>(in.batch);
  const double rank_batch = parallel.cfg_parallel ? 1.0 : batch, rank_rows = rank_batch * tokens / shards;
  const bool whole = o.compare_dense || o.check;
  const double inputs = 4.0 * batch * (static_cast<double>(config.in_channels * in.latent.frames * in.latent.height * in.latent.width) +
                                       static_cast<double>(in.text_tokens * config.text_dim));
  // Per-request LoRA factors: bf16 on the device, fp32 on the CPU.
  const double lora_elements =
      o.lora_rank > 0 ? static_cast<double>(o.lora_adapters) * static_cast<double>(wan_lora_elements(config, o.lora_rank)) : 0.0;
  WorkEstimate e;
  if (device.is_cuda()) {
    const bool fp8 = o.weights == "fp8";
    const bool fp8_attention = o.attention_dtype == "fp8";
    e.device_bytes = wan_cuda_weight_bytes(config, fp8) + wan_cuda_activation_bytes(config, rank_rows, fp8, fp8_attention) +
                     (whole ? wan_cuda_activation_bytes(config, batch * tokens, fp8) : 0.0) + 2.0 * inputs + 2.0 * lora_elements;
    e.host_bytes = 2.0 * inputs;
  } else {
    e.host_bytes = wan_cpu_weight_bytes(config) + 2.0 * inputs + 4.0 * lora_elements +
                   std::max(wan_cpu_activation_bytes(config, rank_rows), whole ? wan_cpu_activation_bytes(config, batch * tokens) : 0.0);
  }
  const double text = static_cast<double>(in.text_tokens);
  e.flop = static_cast<double>(o.warmup + o.steps) * wan_forward_flop(config, rank_batch, tokens, text) / shards +
           (whole ? wan_forward_flop(config, batch, tokens, text) : 0.0);
  return e;
}

int run_dit_bench(const DitBenchOptions& o, const SparseAttnFlags& flags, const ParallelFlags& parallel) {
  const Device asked = budget_device(o.budget, o.device, "--device");
  const SparseAttnEnv& env = process_sparse_attn_env();
  const bool sparse = sparse_attn_requested(flags, env);
  if (!o.layer_configs.empty() && !sparse)
    fail_argument("--sparse-attn-layers", "given with a sparse configuration for the other blocks (a --sparse-attn-* flag)",
                  "no sparse configuration");
  if (o.compare_dense && !sparse && o.attention_dtype == "bf16")
    fail_argument("--compare-dense",
                  "a sparse configuration (a --sparse-attn-* flag or its environment variable) or --attention-dtype fp8 to compare",
                  "dense bf16 attention already");
  if (o.layers > 0 && !o.from_dir.empty())
    fail_argument("--layers", "not given with --from-dir (a checkpoint has all its layers)", o.layers);
  if (!o.transformer_file.empty() && o.from_dir.empty())
    fail_argument("--transformer-file", "given with --from-dir (the directory's config.json describes the model)",
                  quoted_excerpt(o.transformer_file));
  WanConfig config = o.from_dir.empty() ? bench_preset(o.model) : load_wan_config(o.from_dir);
  if (o.layers > 0) config.num_layers = o.layers;
  BenchInputs in = bench_inputs(o, config);
  if (parallel.cfg_parallel && in.batch != 2)
    fail_argument("--batch", "2 with --cfg-parallel (each CFG rank runs one of the two guidance branches)", in.batch);
  if (o.lora_rank > 0 && in.batch % o.lora_adapters != 0)
    fail_argument("--lora-adapters", detail::concat("a divisor of the batch ", in.batch, " (each adapter takes as many entries)"),
                  o.lora_adapters);
  const int ranks = parallel.ulysses * parallel.ring * (parallel.cfg_parallel ? 2 : 1);
  const std::string shape_flags =
      (o.from_dir.empty() ? "--model " + o.model : "--from-dir " + quoted_excerpt(o.from_dir)) +
      (o.inputs.empty() ? detail::concat(" --frames ", o.frames, " --height ", o.height, " --width ", o.width, " --batch ", o.batch)
                        : " --inputs " + quoted_excerpt(o.inputs)) +
      (o.layers > 0 ? detail::concat(" --layers ", o.layers) : "") + detail::concat(" --steps ", o.steps, " --warmup ", o.warmup);
  const WorkEstimate estimate = dit_bench_estimate(o, config, in, parallel, asked);
  if (!check_work_budget(estimate, o.budget, asked, static_cast<int>(o.threads), shape_flags,
                         ranks > 1 ? detail::concat("dit-bench, per rank of ", ranks) : std::string("dit-bench")))
    return 0;
  make_random_inputs(o, config, in);
  // The ranks (none unless the flags or the environment ask): each runs its branch of the batch.
  ParallelRun run(parallel, asked);
  const Device device = run.device();
  const ParallelGroups* groups = run.groups();
  const bool cfg_split = groups != nullptr && groups->cfg->size() > 1;
  const int64_t branch = cfg_split ? groups->coordinates.cfg : 0, rank_batch = cfg_split ? 1 : in.batch;
  if (o.check && groups == nullptr)
    fail_argument("--check", "a parallel run (--ulysses / --ring / --cfg-parallel, or the TESSEL_* environment)", "one process");
  const LatentShape latent = in.latent;
  const int64_t tokens = latent.frames / config.patch_size[0] * (latent.height / config.patch_size[1]) *
                         (latent.width / config.patch_size[2]);
  WanAttentionOptions attention;
  attention.parallel = groups;
  attention.precision = attention_precision(o.attention_dtype, device);
  std::unique_ptr<BackendRegistry> registry;
  if (sparse) {
    registry = make_cli_registry();
    attention.registry = registry.get();
    attention.config = sparse_attn_config_from(flags, env);
    attention.backend_override = backend_override(env);
    // Patterns with a geometry see the latent's patch grid unless the config names one.
    if (!attention.config.geometry.spatial_layout && config.patch_size[1] == config.patch_size[2])
      attention.config.geometry.spatial_layout = wan_spatial_layout(config, latent.frames, latent.height, latent.width);
    if (!o.layer_configs.empty()) attention.layer_configs = parse_layer_configs(o.layer_configs, attention.config, config.num_layers);
  }
  if (!o.attention_kernel_variant.empty()) {
    // Every attention call of this head dim and precision in the run (process-wide).
    if (!device.is_cuda())
      fail_argument("--attention-kernel-variant", "--device cuda[:N] (the CPU has no kernel variants)", device.str());
    try {
      force_attention_kernel_variant(device, config.attention_head_dim, o.attention_kernel_variant, attention.precision);
    } catch (const Error& e) {
      throw Error(std::string("--attention-kernel-variant: ") + e.what());
    }
  }
  const WanWeightResidency residency = offload_residency(o.offload, device);
  const WanWeightPrecision precision = weights_precision(o.weights, device);
  std::shared_ptr<void> held_memory;  // what a smaller card would not have, held until the end
  if (o.device_memory_limit_gib > 0.0)
    held_memory = hold_device_memory_beyond(device, static_cast<size_t>(o.device_memory_limit_gib * double(1 << 30)),
                                            "--device-memory-limit");
  const std::optional<DeviceMemory> memory_before = device_memory(device);
  const auto load_start = std::chrono::steady_clock::now();
  const WanTransformer model = o.from_dir.empty()
                                   ? WanTransformer::random(config, static_cast<uint64_t>(o.seed), attention, device, residency, precision)
                                   : WanTransformer::load(o.from_dir, attention, device, nullptr, residency, precision, o.transformer_file);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  // Per-request LoRA: the adapters resident beside the model, one per group of entries.
  std::optional<WanLoraBank> lora_bank;
  WanLoraSelection lora, rank_lora;
  if (o.lora_rank > 0) {
    lora_bank.emplace(WanLoraBank::random(config, device, o.lora_adapters, o.lora_rank, static_cast<uint64_t>(o.seed) + 7919));
    lora.bank = rank_lora.bank = &*lora_bank;
    for (int64_t b = 0; b < in.batch; ++b) lora.adapters.push_back(static_cast<int32_t>(b / (in.batch / o.lora_adapters)));
    rank_lora.adapters = cfg_split ? std::vector<int32_t>{lora.adapters[static_cast<size_t>(branch)]} : lora.adapters;
  }
  const WanLoraSelection* const whole_lora = lora_bank ? &lora : nullptr;
  const WanLoraSelection* const step_lora = lora_bank ? &rank_lora : nullptr;

  // The inputs move to the model's device once: this rank's branch, and the whole batch when a
  // one-process forward is compared.
  const Tensor latents = (cfg_split ? batch_entry(in.latents, branch) : in.latents).to(device);
  const Tensor text = (cfg_split ? batch_entry(in.text, branch) : in.text).to(device);
  const Tensor image = !in.image.defined() ? Tensor{} : (cfg_split ? batch_entry(in.image, branch) : in.image).to(device);
  const auto output_shape = [&](const Tensor& input) {
    Shape shape = input.shape();
    shape[1] = config.out_channels;
    return shape;
  };
  // One forward, with the image's CLIP features for a model that takes them.
  const auto forward = [](const WanTransformer& transformer, const ExecContext& run_ctx, const StepInfo& step, const Tensor& x,
                          const Tensor& t, const Tensor& context, const Tensor& clip, Tensor& y, WanForwardProfile* timing,
                          const WanLoraSelection* adapters) {
    if (clip.defined())
      transformer.forward(run_ctx, step, x, t, context, clip, y, timing, nullptr, adapters);
    else
      transformer.forward(run_ctx, step, x, t, context, y, timing, nullptr, adapters);
  };
  Tensor timestep;
  Tensor out = Tensor::empty(output_shape(latents), DType::kF32, device);
  // The whole prediction: `out`, or both branches gathered from the CFG ranks.
  Tensor whole_out = cfg_split ? Tensor::empty(output_shape(in.latents), DType::kF32, device) : out;
  Shape stacked = out.shape();  // (branches, 1, C, F, H, W): how the CFG gather sees whole_out
  stacked.insert(stacked.begin(), cfg_split ? 2 : 1);
  const TensorView branches(whole_out.data(), DType::kF32, device, stacked);

  ExecContext ctx;
  ctx.device = device;
  ctx.num_threads = static_cast<int>(o.threads);
  // The activations (CUDA) or attention scratch (CPU), sized once before the first step.
  Workspace workspace(device);
  const int64_t image_tokens = in.image.defined() ? in.image.size(1) : 0;
  workspace.reserve(model.workspace_bytes(ctx, rank_batch, latent.frames, latent.height, latent.width, in.text_tokens, false, image_tokens,
                                          lora_bank ? lora_bank->max_rank() : 0));
  ctx.workspace = &workspace;
  const std::unique_ptr<BenchTimer> timer = make_bench_timer(ctx);
  const int64_t total_steps = o.warmup + o.steps;
  WanForwardProfile profile;
  std::vector<double> step_s;
  CommunicationMeter communication;
  // CUDA under sequence parallelism: the device time of the all-to-alls and of the ring exchanges
  // the attention did not hide, from events at the phase boundaries of every block's attention.
  std::optional<PhaseTimeline> timeline;
  double exchange_ms = 0.0;
  if (device.is_cuda() && groups != nullptr) {
    timeline.emplace(device);
    model.set_phase_timeline(&*timeline);
  }
  for (int64_t step = 0; step < total_steps; ++step) {
    const Tensor host_timestep = step_timestep(in, in.batch, step, total_steps);
    timestep = (cfg_split ? batch_entry(host_timestep, branch) : host_timestep).to(device);
    const bool timed = step >= o.warmup;
    run.barrier();  // the ranks start a step together
    run.meter().reset();
    timer->start();
    if (timeline) timeline->begin(ctx);
    forward(model, ctx, StepInfo::at(step, total_steps), latents, timestep, text, image, out, timed ? &profile : nullptr, step_lora);
    if (cfg_split) gather_cfg_branches(ctx, *groups->cfg, out, branches);
    const double ms = timer->stop_ms();
    if (!timed) continue;
    step_s.push_back(ms / 1000.0);
    communication.seconds += run.meter().seconds;
    communication.bytes += run.meter().bytes;
    communication.calls += run.meter().calls;
    if (timeline)
      for (const PhaseTimeline::Phase& phase : timeline->phases())
        if (phase.name == "ulysses all_to_all" || phase.name == "ring exchange wait") exchange_ms += phase.device_ms;
  }
  if (timeline) model.set_phase_timeline(nullptr);
  if (!run.is_root()) return 0;  // the other ranks' outputs are the root's
  const std::optional<DeviceMemory> memory_after = device_memory(device);
  if (!o.save_output.empty()) {
    const Tensor host_out = whole_out.to(Device::cpu());
    write_safetensors(o.save_output, {{"output", host_out.view()}});
  }

  // One process's forward of the whole batch at the last step (the same weights): with dense
  // attention (--compare-dense), or with this run's attention (--check).
  const auto one_process = [&](const WanAttentionOptions& options, const StepInfo& step) {
    const Tensor all_latents = in.latents.to(device), all_text = in.text.to(device);
    const Tensor all_image = in.image.defined() ? in.image.to(device) : Tensor{};
    const Tensor all_timestep = step_timestep(in, in.batch, total_steps - 1, total_steps).to(device);
    Tensor result = Tensor::empty(output_shape(all_latents), DType::kF32, device);
    ExecContext whole_batch = ctx;  // its own scratch: the workspace was sized for this rank's batch
    whole_batch.workspace = nullptr;
    forward(model.with_attention(options), whole_batch, step, all_latents, all_timestep, all_text, all_image, result, nullptr, whole_lora);
    return result.to(Device::cpu());
  };
  const Tensor host_whole_out = whole_out.to(Device::cpu());
  double rel_l2_vs_dense = -1.0, rel_l2_vs_one_process = -1.0;
  if (o.compare_dense) rel_l2_vs_dense = rel_l2(host_whole_out, one_process(WanAttentionOptions{}, StepInfo{}));
  WanAttentionOptions local_attention = attention;
  local_attention.parallel = nullptr;
  if (o.check) rel_l2_vs_one_process = rel_l2(host_whole_out, one_process(local_attention, StepInfo::at(total_steps - 1, total_steps)));
  const bool check_pass = !o.check || rel_l2_vs_one_process <= parallel_tolerance(device);

  const SparseAttention* first = model.block_attention(0);
  const std::string backend = first && first->resolution().backend ? first->resolution().backend->name() : "dense";
  const double n = static_cast<double>(profile.forwards);
  nlohmann::json report = {
      {"model", o.from_dir.empty() ? o.model : o.from_dir},
      {"layers", config.num_layers},
      {"dim", config.inner_dim()},
      {"heads", config.num_attention_heads},
      {"batch", in.batch},
      {"latent", {latent.frames, latent.height, latent.width}},
      {"tokens", tokens},
      {"text_tokens", in.text_tokens},
      {"image_tokens", image_tokens},
      {"device", device.str()},
      {"dtype", device.is_cuda() ? "bf16" : "fp32"},
      {"threads", ctx.threads()},
      {"attention_backend", backend},
      {"load_s", load_s},
      {"steps_timed", o.steps},
      {"step_s_median", median(step_s)},
      {"step_s_mean", profile.total_s() / n},
      {"self_attention_density", profile.mean_self_attention_density()},
      {"dense_self_attention_calls", profile.dense_self_attention_calls},
      {"self_attention_calls", profile.self_attention_calls},
      {"breakdown_s_per_step",
       {{"attention", profile.attention_s / n}, {"estimation", profile.estimation_s / n}, {"gemm", profile.gemm_s / n},
        {"norm_rope", profile.norm_rope_s / n}, {"other", profile.other_s / n}}},
      {"ranks", run.world_size()},
      {"ulysses", parallel.ulysses},
      {"ulysses_head_groups", parallel.ulysses_head_groups},
      {"ulysses_sm_margin", parallel.ulysses_sm_margin},
      {"ring", parallel.ring},
      {"cfg", cfg_split ? 2 : 1},
      // CPU: the seconds a rank was blocked in communication; CUDA: the device time of the
      // attention's all-to-alls (with head groups: the waits the attention did not hide) and
      // unhidden ring exchanges (waiting for slower ranks included).
      {"comm_s_per_step", device.is_cpu() ? nlohmann::json(communication.seconds / n)
                          : timeline      ? nlohmann::json(exchange_ms / 1000.0 / n)
                                          : nlohmann::json()},
      {"sent_mb_per_step", communication.bytes / n / 1e6},
      {"weights", o.weights},
      {"attention_dtype", o.attention_dtype},
      {"attention_kernel_variant", o.attention_kernel_variant.empty() ? "default" : o.attention_kernel_variant},
      {"weights_bytes", model.weight_bytes()},
      {"offloaded_weights_bytes", model.offloaded_weight_bytes()},
      {"workspace_bytes", workspace.capacity()},
      {"lora_rank", o.lora_rank},
      {"lora_adapters", o.lora_rank > 0 ? o.lora_adapters : 0},
      {"lora_bytes", lora_bank ? lora_bank->bytes() : 0},
  };
  // Device memory the run added (weights, workspace, plans; the CUDA context was up before), as
  // the driver counts it after the timed steps: nothing is freed in between, so it is the peak.
  if (memory_before && memory_after) report["peak_device_memory_bytes"] = memory_after->used - memory_before->used;
  if (device.is_cuda()) report["estimated_device_memory_bytes"] = estimate.device_bytes;
  report["estimated_host_memory_bytes"] = estimate.host_bytes;
  report["peak_host_memory_bytes"] = peak_host_memory_bytes();
  if (o.compare_dense) report["rel_l2_vs_dense"] = rel_l2_vs_dense;
  if (o.check) {
    report["rel_l2_vs_one_process"] = rel_l2_vs_one_process;
    report["check_tolerance"] = parallel_tolerance(device);
    report["check_pass"] = check_pass;
  }
  if (o.json) {
    std::cout << report.dump() << "\n";
    return check_pass ? 0 : 1;
  }
  const std::string where = device.is_cuda() ? device.str() + (o.weights == "fp8" ? " bf16, fp8 block weights and GEMMs" : " bf16") +
                                                  (o.attention_dtype == "fp8" ? ", fp8 self-attention" : "")
                                            : detail::concat("cpu fp32, ", ctx.threads(), " threads");
  std::printf("Wan transformer %s: %lld layers, dim %lld, %lld heads; %s; attention: %s\n", report["model"].get<std::string>().c_str(),
              static_cast<long long>(config.num_layers), static_cast<long long>(config.inner_dim()),
              static_cast<long long>(config.num_attention_heads), where.c_str(), backend.c_str());
  std::printf("batch %lld, latent %lld x %lld x %lld -> %lld tokens, %lld text tokens%s; weights ready in %.2f s\n",
              static_cast<long long>(in.batch), static_cast<long long>(latent.frames), static_cast<long long>(latent.height),
              static_cast<long long>(latent.width), static_cast<long long>(tokens), static_cast<long long>(in.text_tokens),
              image_tokens > 0 ? detail::concat(", ", image_tokens, " image tokens").c_str() : "", load_s);
  std::printf("step: median %.4f s, mean %.4f s over %lld; mean per kind of work:\n", median(step_s), profile.total_s() / n,
              static_cast<long long>(o.steps));
  const double total = profile.total_s();
  for (const auto& [name, seconds] : {std::pair{"attention", profile.attention_s}, {"estimation", profile.estimation_s},
                                      {"gemm", profile.gemm_s}, {"norm/rope", profile.norm_rope_s}, {"other", profile.other_s}})
    std::printf("  %-10s %9.4f s  %5.1f%%\n", name, seconds / n, total > 0 ? 100.0 * seconds / total : 0.0);
  std::printf("memory: weights (%s blocks) %s", o.weights.c_str(), format_bytes(static_cast<double>(model.weight_bytes())).c_str());
  if (model.offloaded_weight_bytes() > 0)
    std::printf(" (blocks offloaded: %s in pinned host memory)", format_bytes(static_cast<double>(model.offloaded_weight_bytes())).c_str());
  std::printf(", workspace %s", format_bytes(static_cast<double>(workspace.capacity())).c_str());
  if (report.contains("peak_device_memory_bytes"))
    std::printf(", device memory taken by the run %s (estimated %s)", format_bytes(report["peak_device_memory_bytes"].get<double>()).c_str(),
                format_bytes(estimate.device_bytes).c_str());
  std::printf("; peak host memory %s (estimated %s)\n", format_bytes(peak_host_memory_bytes()).c_str(), format_bytes(estimate.host_bytes).c_str());
  std::printf("self-attention: mean density %.3f over %lld calls, %lld of them dense\n", profile.mean_self_attention_density(),
              static_cast<long long>(profile.self_attention_calls), static_cast<long long>(profile.dense_self_attention_calls));
  if (lora_bank)
    std::printf("per-request LoRA: %lld adapters of rank %lld on every linear layer (%s), each on %lld of the batch's entries; timed "
                "with the GEMMs\n",
                static_cast<long long>(o.lora_adapters), static_cast<long long>(o.lora_rank),
                format_bytes(static_cast<double>(lora_bank->bytes())).c_str(), static_cast<long long>(in.batch / o.lora_adapters));
  if (groups != nullptr) {
    std::printf("parallel: %d ranks, %s; sent %.2f MB per step per rank", run.world_size(), parallel.describe().c_str(),
                communication.bytes / n / 1e6);
    if (device.is_cpu()) std::printf(", %.4f s per step blocked in communication", communication.seconds / n);
    if (timeline) {
      const double step_median = median(step_s);
      std::printf(", %.4f s per step in the attention's exchanges (%.1f %% of the step)", exchange_ms / 1000.0 / n,
                  step_median > 0.0 ? 100.0 * exchange_ms / 1000.0 / n / step_median : 0.0);
    }
    std::printf("\n");
  }
  if (o.compare_dense) std::printf("last step's output vs dense bf16 attention: rel-L2 %.3e\n", rel_l2_vs_dense);
  if (o.check)
    std::printf("last step's output vs one process: rel-L2 %.3e (tolerance %.0e) %s\n", rel_l2_vs_one_process, parallel_tolerance(device),
                check_pass ? "ok" : "FAIL");
  return check_pass ? 0 : 1;
}

CommandRegistration registration{
    "dit-bench", "Time denoising steps of the Wan video transformer (random weights or a checkpoint), dense or sparse",
    [](CLI::App& app) {
      auto options = std::make_shared<DitBenchOptions>();
      auto flags = std::make_shared<SparseAttnFlags>();
      auto parallel = std::make_shared<ParallelFlags>();
      std::vector<std::string> presets = bench_presets();
      app.add_option("--device", options->device, "cpu (fp32) or cuda[:N] (bf16 weights and GEMMs, fp32 residual stream)")
          ->capture_default_str()
          ->check(device_name());
      auto* model = app.add_option("--model", options->model, "named size with random weights")->capture_default_str()->check(one_of(presets));
      app.add_option("--from-dir", options->from_dir, "a diffusers WanTransformer3DModel checkpoint directory instead of --model")
          ->check(non_empty_path())
          ->excludes(model);
      app.add_option("--frames", options->frames, "video frames, 4k + 1 (latent frames: k + 1)")
          ->capture_default_str()
          ->check(integer_in(1, 1 << 16));
      app.add_option("--height", options->height, "video height in pixels (latent: / 8)")->capture_default_str()->check(integer_in(1, 1 << 16));
      app.add_option("--width", options->width, "video width in pixels (latent: / 8)")->capture_default_str()->check(integer_in(1, 1 << 16));
      app.add_option("--batch", options->batch, "latents per call (2: classifier-free guidance's two branches)")
          ->capture_default_str()
          ->check(integer_in(1, 64));
      app.add_option("--text-tokens", options->text_tokens, "text encoder tokens")->capture_default_str()->check(integer_in(1, 1 << 16));
      app.add_option("--image-tokens", options->image_tokens,
                     "CLIP tokens per image of a model with an image branch (Wan 2.1 I2V; FLF2V takes its position table's)")
          ->capture_default_str()
          ->check(integer_in(1, 1 << 16));
      app.add_option("--layers", options->layers, "transformer blocks to run (default: the model's)")->check(integer_in(1, 1024));
      app.add_option("--steps", options->steps, "timed denoising steps (the median is reported)")
          ->capture_default_str()
          ->check(integer_in(1, kMaxRepeats));
      app.add_option("--warmup", options->warmup, "untimed steps first (they count in the schedule's step index)")
          ->capture_default_str()
          ->check(integer_in(0, kMaxRepeats));
      app.add_option("--threads", options->threads, "CPU threads (default: all)")->check(integer_in(1, kMaxThreads));
      app.add_option("--seed", options->seed, "seed of the random weights and inputs")->capture_default_str()->check(integer_in(0, INT64_MAX));
      app.add_flag("--json", options->json, "print one JSON object instead of a table");
      app.add_option("--sparse-attn-layers", options->layer_configs,
                     "per-block configs, '<json>' or @file.json: {\"<block>\": {fields over the whole config}, ...}");
      auto* inputs = app.add_option("--inputs", options->inputs,
                                    "safetensors file with the forward's inputs (hidden_states (B, C, F, H, W), timestep (B), "
                                    "encoder_hidden_states (B, L, text_dim), and encoder_hidden_states_image (B, I, image_dim) "
                                    "for a model with an image branch) instead of random ones; every step uses them");
      for (const char* shaped : {"--frames", "--height", "--width", "--batch", "--text-tokens", "--image-tokens"})
        app.get_option(shaped)->excludes(inputs);
      app.add_option("--save-output", options->save_output, "write the last timed step's output (fp32, tensor 'output') to this safetensors file")
          ->check(writable_file_path());
      add_offload_flag(app, options->offload);
      add_weights_flag(app, options->weights);
      add_attention_dtype_flag(app, options->attention_dtype);
      app.add_option("--attention-kernel-variant", options->attention_kernel_variant,
                     "force the attention kernel variant of the run's head dim and precision (the names `tessel bench "
                     "--kernel-variants` takes; with --attention-dtype fp8 an FP8 one, e.g. fp8+smoothk+lazy+pingpong, whose K "
                     "smoothing the fused q/k quantisation leaves out); CUDA only");
      app.add_option("--lora-rank", options->lora_rank,
                     "per-request LoRA: random adapters of this rank on every linear layer, applied unmerged in each forward (0: none)")
          ->capture_default_str()
          ->check(integer_in(0, 4096));
      CLI::Option* lora_adapters = app.add_option("--lora-adapters", options->lora_adapters,
                     "with --lora-rank: this many adapters, the batch's entries split into as many contiguous groups, one adapter each")
          ->capture_default_str()
          ->check(integer_in(1, 64));
      add_transformer_file_flags(app, options->transformer_file, nullptr);
      app.add_option("--device-memory-limit", options->device_memory_limit_gib,
                     "GiB: hold the rest of the GPU's memory for the run, as on a card of this size (with --device cuda)")
          ->check(number_in(0.25, 1e6));
      app.add_flag("--compare-dense", options->compare_dense,
                   "also run the last step with dense bf16 attention and report the output's relative L2 difference (the "
                   "sparse configuration's or --attention-dtype fp8's error)");
      app.add_flag("--check", options->check,
                   "parallel runs: also run the last step in one process and compare the whole output (exit 1 beyond the tolerance)");
      add_sparse_attn_flags(app, *flags);
      add_parallel_flags(app, *parallel);
      add_budget_flags(app, options->budget);
      return CommandRunner([options, flags, parallel, lora_adapters] {
        check_applies(lora_adapters, options->lora_rank > 0, "--lora-rank R >= 1 (the adapters it splits the batch among)");
        return run_dit_bench(*options, *flags, *parallel);
      });
    }};

}  // namespace
}  // namespace tessel::cli
