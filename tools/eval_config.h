// `tessel eval --config calibrated.json`: checks a per-layer, per-head config written by
// `tessel calibrate --out` on held-out captured steps (files per layer, or synthetic video
// captures), on the CPU or a CUDA device.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "work_budget.h"

namespace tessel::cli {

struct EvalConfigArgs {
  std::string config;               // the calibrated config file
  std::vector<std::string> layers;  // per layer of the config: comma-separated capture files
  std::string grid;                 // or synthetic captures on this grid
  // Synthetic captures' heads and head dimension; unset: the config's "shape" (what it was
  // calibrated on), else 12 and 64 as calibrate's defaults.
  std::optional<int64_t> heads, head_dim;
  int64_t synthetic_steps = 1;
  uint64_t seed = 0;                // shifts the synthetic held-out seeds
  std::string metric;               // empty: the config's
  double target = 0.0;              // 0: the config's
  std::string device = "cpu";
  bool report_only = false;         // a missed target is reported, the exit status stays 0
  bool json = false;
  BudgetFlags budget;  // --max-memory / --force
};

// Prints the per-layer report (the per-head one too with json); returns 0 when every head of every
// layer meets the target on every step (or report_only), 1 otherwise, with the misses named on
// stderr. Throws Error naming the option for unreadable or mismatched inputs.
int run_eval_config(const EvalConfigArgs& args);

}  // namespace tessel::cli
