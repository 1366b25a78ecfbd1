// `tessel bench --steps N`: a simulated denoising loop through the sparse-attention interface.
// The backend is resolved as everywhere (env TESSEL_SPARSE_ATTN_BACKEND, passed as
// backend_override > --sparse-attn-backend / config > auto > none), then N steps of `layers`
// SparseAttention layers (sharing one plan
// cache) run on the bench shape; each step reports the backend that ran, the density computed,
// the median time over --iters runs, and the error against dense attention on sampled rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench.h"
#include "tessel/sparse/config.h"

namespace tessel::cli {

struct StepsConfig {
  int64_t steps = 0;   // 0 = no denoising loop
  int64_t layers = 1;  // attention layers per step (dense_layers applies to the first ones)
  SparseAttnConfig sparse;
  std::string backend_override;  // from the environment ("" = none)
};

struct StepResult {
  int64_t step = 0;
  std::string backend;         // backend that ran at the step's last layer ("dense" when it ran dense)
  int64_t dense_layers = 0;    // layers that ran dense attention at this step
  double density = 1.0;        // mean over layers of blocks computed / all blocks
  double ms = 0.0;             // median time of one step (all layers)
  double estimate_ms = 0.0;    // of which choosing blocks (data-dependent backends)
  double rel_err_vs_dense = 0.0;  // max |out - dense| / max |dense| at the last layer, sampled rows
};

struct StepsReport {
  BenchConfig bench;
  StepsConfig steps;
  std::string backend;  // resolved backend ("none" = dense attention)
  std::string origin;   // "built-in", a plugin path, or "" for none
  std::string source;   // env, config, auto or none
  int64_t plan_cache_hits = 0, plan_cache_misses = 0;
  std::vector<StepResult> results;

  nlohmann::json to_json() const;
  std::string to_table() const;
};

// Throws Error for a bad step count, layer count or config, or when the backend cannot run.
StepsReport run_denoising_steps(const BenchConfig& bench, const StepsConfig& steps);

}  // namespace tessel::cli
