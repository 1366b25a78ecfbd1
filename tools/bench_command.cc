// `tessel bench`: flags -> BenchConfig -> run_bench() -> table or JSON.
#include <iostream>
#include <string>

#include "bench.h"
#include "bench_steps.h"
#include "command.h"
#include "sparse_attn_flags.h"
#include "tessel/core/device.h"
#include "tessel/core/error.h"

namespace tessel::cli {
namespace {

CommandRegistration registration{
    "bench", "Time dense and block-sparse attention at several mask densities and check them against fp64",
    [](CLI::App& app) {
      auto config = std::make_shared<BenchConfig>();
      auto device = std::make_shared<std::string>(cuda_available() ? "cuda" : "cpu");
      auto dtype = std::make_shared<std::string>("bf16");
      auto json = std::make_shared<bool>(false);
      app.add_option("--device", *device, "cpu or cuda[:N] (default: cuda when a GPU is present)")->capture_default_str();
      app.add_option("--dtype", *dtype, "fp32, fp16 or bf16")->capture_default_str();
      app.add_option("--batch", config->batch, "batch size")->capture_default_str();
      app.add_option("--heads", config->heads, "query heads")->capture_default_str();
      app.add_option("--kv-heads", config->kv_heads, "key/value heads (GQA; default: --heads)");
      app.add_option("--head-dim", config->head_dim, "head dimension")->capture_default_str();
      app.add_option("--seq", config->seq, "query tokens")->capture_default_str();
      app.add_option("--seq-kv", config->seq_kv, "key tokens (default: --seq)");
      app.add_option("--density", config->densities, "comma-separated kept-block fractions; 1 = dense kernel")
          ->delimiter(',')
          ->capture_default_str();
      app.add_option("--block-q", config->block_q, "query tokens per mask block")->capture_default_str();
      app.add_option("--block-kv", config->block_kv, "key tokens per mask block")->capture_default_str();
      app.add_option("--iters", config->iters, "timed runs (the median is reported)")->capture_default_str();
      app.add_option("--warmup", config->warmup, "untimed runs first")->capture_default_str();
      app.add_option("--threads", config->threads, "CPU threads (default: all)");
      app.add_option("--seed", config->seed, "seed of the inputs and masks")->capture_default_str();
      app.add_flag("--causal", config->causal, "causal attention (bottom-right aligned)");
      app.add_option("--save-mask", config->save_mask_dir,
                     "write each mask used (FlexAttention's kv_num_blocks/kv_indices) to this directory");
      app.add_flag("--json", *json, "print one JSON object instead of a table");
      // The sparse-attention interface (bench_steps.h): --steps N runs a denoising loop through it.
      auto steps = std::make_shared<StepsConfig>();
      auto sparse_flags = std::make_shared<SparseAttnFlags>();
      app.add_option("--steps", steps->steps, "run N denoising steps through the resolved sparse backend");
      app.add_option("--layers", steps->layers, "attention layers per step with --steps")->capture_default_str();
      add_sparse_attn_flags(app, *sparse_flags);
      return CommandRunner([config, device, dtype, json, steps, sparse_flags] {
        config->device = parse_device(*device);
        config->dtype = parse_dtype(*dtype);
        const SparseAttnFlags& f = *sparse_flags;
        if (steps->steps == 0 && f.any())
          fail_argument("--steps", "N >= 1 with the --sparse-attn-* flags (they configure the denoising loop)", 0);
        if (steps->steps != 0) {
          const SparseAttnEnv& env = process_sparse_attn_env();
          steps->sparse = sparse_attn_config_from(f, env);
          steps->backend_override = backend_override(env);
          const StepsReport report = run_denoising_steps(*config, *steps);
          std::cout << (*json ? report.to_json().dump() + "\n" : report.to_table());
          return 0;
        }
        const BenchReport report = run_bench(*config);
        if (*json)
          std::cout << report.to_json().dump() << "\n";
        else
          std::cout << report.to_table();
        return 0;
      });
    }};

}  // namespace
}  // namespace tessel::cli
