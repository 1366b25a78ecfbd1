// `tessel bench`: flags -> BenchConfig -> run_bench() -> table or JSON.
#include <cmath>
#include <filesystem>
#include <iostream>
#include <string>

#include "bench.h"
#include "bench_steps.h"
#include "command.h"
#include "option_checks.h"
#include "sparse_attn_flags.h"
#include "work_budget.h"
#include "tessel/core/device.h"
#include "tessel/core/error.h"

namespace tessel::cli {
namespace {

// Relations between the options and the memory the run needs, checked before any work.
void check_bench_config(const BenchConfig& c, const StepsConfig& steps, bool kv_heads_given) {
  if (kv_heads_given) require_multiple("--heads", c.heads, "--kv-heads", c.kv_heads);
  if (!c.save_mask_dir.empty()) {
    std::error_code error;
    const std::filesystem::path dir(c.save_mask_dir);
    if (std::filesystem::exists(dir, error) && !std::filesystem::is_directory(dir, error))
      fail_argument("--save-mask", "a directory (created when missing)", quoted_excerpt(c.save_mask_dir, 200) + " (not a directory)");
    for (std::filesystem::path parent = dir.parent_path(); !parent.empty() && parent != parent.root_path();
         parent = parent.parent_path())
      if (std::filesystem::exists(parent, error) && !std::filesystem::is_directory(parent, error))
        fail_argument("--save-mask", "a directory (created when missing)",
                      quoted_excerpt(c.save_mask_dir, 200) + " (" + parent.string() + " is a file)");
  }
  if (steps.steps == 0 && steps.layers != 1)
    fail_argument("--layers", "to be given with --steps N (it sets the layers of the denoising loop)", steps.layers);
}

// What the run holds and computes: the host's q, k, v (read by the fp64 check of a few rows), their
// copies on the bench device with the output, the log-sum-exp and (--fp8) the e4m3 copies, and the
// block masks of the sparse densities; the attention of every method and density at its kept
// fraction, (--warmup + --iters + 1) times, or with --steps N the loop's N x --layers passes.
WorkEstimate bench_estimate(const BenchConfig& c, const StepsConfig& steps) {
  const double element = static_cast<double>(dtype_size(c.dtype));
  const double q = double(c.batch) * double(c.seq) * double(c.heads) * double(c.head_dim);
  const double kv = double(c.batch) * double(c.effective_seq_kv()) * double(c.effective_kv_heads()) * double(c.head_dim);
  const double blocks = double(c.batch) * double(c.heads) * std::ceil(double(c.seq) / double(c.block_q)) *
                        std::ceil(double(c.effective_seq_kv()) / double(c.block_kv));
  double kept = 0.0, sparse = 0.0;  // the densities' sum, and how many need a mask
  for (double d : c.densities) kept += d, sparse += d < 1.0 ? 1.0 : 0.0;
  const double host_inputs = (q + 2.0 * kv) * element;
  const double on_device = host_inputs + q * element + 4.0 * double(c.batch) * double(c.heads) * double(c.seq) +
                           (c.fp8 ? q + 2.0 * kv : 0.0);
  const double masks = 8.0 * blocks * std::max(1.0, sparse);
  const double pass = 4.0 * q * double(c.effective_seq_kv()) * (c.causal ? 0.5 : 1.0);
  const double variants = c.kernel_variants.empty() ? 1.0 : std::max<double>(4.0, double(c.kernel_variants.size()));
  WorkEstimate e;
  e.host_bytes = host_inputs + masks + (c.device.is_cuda() ? 0.0 : on_device);
  e.device_bytes = c.device.is_cuda() ? on_device + masks : 0.0;
  e.flop = steps.steps > 0 ? pass * double(steps.steps) * double(steps.layers)
                           : pass * kept * (c.fp8 ? 2.0 : 1.0) * variants * double(c.warmup + c.iters + 1);
  return e;
}

// The flags the estimate grows with, as the refusal names them.
std::string bench_shape_flags(const BenchConfig& c, const StepsConfig& steps) {
  return detail::concat("--batch ", c.batch, " --seq ", c.seq, " --seq-kv ", c.effective_seq_kv(), " --heads ", c.heads,
                        " --head-dim ", c.head_dim, " --density ", c.densities.size(), " values",
                        steps.steps > 0 ? detail::concat(" --steps ", steps.steps, " --layers ", steps.layers)
                                        : detail::concat(" --iters ", c.iters, " --warmup ", c.warmup));
}

CommandRegistration registration{
    "bench", "Time dense and block-sparse attention at several mask densities and check them against fp64",
    [](CLI::App& app) {
      auto config = std::make_shared<BenchConfig>();
      auto device = std::make_shared<std::string>(cuda_available() ? "cuda" : "cpu");
      auto dtype = std::make_shared<std::string>("bf16");
      auto json = std::make_shared<bool>(false);
      app.add_option("--device", *device, "cpu or cuda[:N] (default: cuda when a GPU is present)")
          ->capture_default_str()
          ->check(device_name());
      app.add_option("--dtype", *dtype, "fp32, fp16 or bf16")->capture_default_str()->check(attention_dtype_name());
      app.add_option("--batch", config->batch, "batch size")->capture_default_str()->check(integer_in(1, 1 << 20));
      app.add_option("--heads", config->heads, "query heads")->capture_default_str()->check(integer_in(1, kMaxHeads));
      auto* kv_heads = app.add_option("--kv-heads", config->kv_heads, "key/value heads (GQA; default: --heads)")
                           ->check(integer_in(1, kMaxHeads));
      app.add_option("--head-dim", config->head_dim, "head dimension")->capture_default_str()->check(integer_in(1, kMaxHeadDim));
      app.add_option("--seq", config->seq, "query tokens")->capture_default_str()->check(integer_in(1, kMaxTokens));
      app.add_option("--seq-kv", config->seq_kv, "key tokens (default: --seq)")->check(integer_in(1, kMaxTokens));
      app.add_option("--density", config->densities, "comma-separated kept-block fractions in (0, 1]; 1 = dense kernel")
          ->delimiter(',')
          ->capture_default_str()
          ->check(number_in(0.0, 1.0, Bounds::kOpenLow));
      app.add_option("--block-q", config->block_q, "query tokens per mask block")
          ->capture_default_str()
          ->check(integer_in(1, kMaxBlockTokens));
      app.add_option("--block-kv", config->block_kv, "key tokens per mask block")
          ->capture_default_str()
          ->check(integer_in(1, kMaxBlockTokens));
      app.add_option("--iters", config->iters, "timed runs (the median is reported)")
          ->capture_default_str()
          ->check(integer_in(1, kMaxRepeats));
      app.add_option("--warmup", config->warmup, "untimed runs first")->capture_default_str()->check(integer_in(0, kMaxRepeats));
      app.add_option("--threads", config->threads, "CPU threads (default: all)")->check(integer_in(1, kMaxThreads));
      app.add_option("--seed", config->seed, "seed of the inputs and masks")->capture_default_str()->check(integer_in(0, INT64_MAX));
      app.add_flag("--causal", config->causal, "causal attention (bottom-right aligned)");
      app.add_flag("--fp8", config->fp8,
                   "also time every method in FP8 (e4m3 with per-block q/k and per-channel v scales; CUDA, "
                   "compute capability 9.0, head dim 128)");
      app.add_option("--save-mask", config->save_mask_dir,
                     "write each mask used (FlexAttention's kv_num_blocks/kv_indices) to this directory");
      app.add_option("--kernel-variants", config->kernel_variants,
                     "time every method under each of these CUDA kernel variants (comma-separated; 'all': every "
                     "one the device has for --head-dim; with --fp8 the FP8 variants 'fp8...' time the FP8 runs "
                     "and the others the plain ones), reported as method@variant")
          ->delimiter(',');
      app.add_flag("--tune", config->tune,
                   "tune the CUDA kernel variant for the dense and block-sparse calls first (as a plan does) and "
                   "report the candidates' times");
      app.add_flag("--json", *json, "print one JSON object instead of a table");
      // The sparse-attention interface (bench_steps.h): --steps N runs a denoising loop through it.
      auto steps = std::make_shared<StepsConfig>();
      auto sparse_flags = std::make_shared<SparseAttnFlags>();
      app.add_option("--steps", steps->steps, "run N denoising steps through the resolved sparse backend")
          ->check(integer_in(0, kMaxRepeats));
      app.add_option("--layers", steps->layers, "attention layers per step with --steps")
          ->capture_default_str()
          ->check(integer_in(1, 1024));
      add_sparse_attn_flags(app, *sparse_flags);
      auto budget = std::make_shared<BudgetFlags>();
      add_budget_flags(app, *budget);
      return CommandRunner([config, device, dtype, json, steps, sparse_flags, kv_heads, budget] {
        config->device = budget_device(*budget, *device, "--device");
        config->dtype = parse_dtype(*dtype);
        check_bench_config(*config, *steps, kv_heads->count() > 0);
        const SparseAttnFlags& f = *sparse_flags;
        if (steps->steps == 0 && f.any())
          fail_argument("--steps", "N >= 1 with the --sparse-attn-* flags (they configure the denoising loop)", 0);
        if (steps->steps != 0) {
          const SparseAttnEnv& env = process_sparse_attn_env();
          steps->sparse = sparse_attn_config_from(f, env);
          steps->backend_override = backend_override(env);
        }
        const WorkEstimate estimate = bench_estimate(*config, *steps);
        if (!check_work_budget(estimate, *budget, config->device, config->threads, bench_shape_flags(*config, *steps), "bench"))
          return 0;
        if (steps->steps != 0) {
          const StepsReport report = run_denoising_steps(*config, *steps);
          std::cout << (*json ? report.to_json().dump() + "\n" : report.to_table());
          return 0;
        }
        const BenchReport report = run_bench(*config);
        if (*json) {
          nlohmann::json out = report.to_json();
          out["estimated_host_memory_bytes"] = estimate.host_bytes;
          out["peak_host_memory_bytes"] = peak_host_memory_bytes();
          std::cout << out.dump() << "\n";
        } else
          std::cout << report.to_table();
        return 0;
      });
    }};

}  // namespace
}  // namespace tessel::cli
