// Sparsity schedules: how much of the attention each denoising step keeps.
//
// A schedule maps (step, total_steps, topk_ratio of the config) to a keep ratio ("density") in
// (0, 1]; 1 means dense attention. With progress p = step / (total_steps - 1) (p = 0 when
// total_steps == 1), the built-ins are:
//   constant:      d(p) = topk_ratio
//   conservative:  d(p) = 1                                   for p < 0.2
//                  d(p) = 1 - 0.7 * (p - 0.2) / 0.8           for p >= 0.2   (1 -> 0.3 at p = 1)
//   aggressive:    d(p) = 0.2 + 0.3 * p                                      (0.2 -> 0.5 at p = 1)
// Dense warm-up composes with any schedule (step_density): steps < warmup.dense_steps and layers
// < warmup.dense_layers are dense whatever the schedule says.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessel/sparse/config.h"

namespace tessel {

using SparsitySchedule = std::function<double(int64_t step, int64_t total_steps, double topk_ratio)>;

// Registers (or replaces) a schedule. The built-in names cannot be replaced. Throws Error on an
// empty name or function.
void register_sparsity_schedule(const std::string& name, SparsitySchedule schedule);
// Throws Error listing the registered names when `name` is unknown.
const SparsitySchedule& get_sparsity_schedule(const std::string& name);
bool has_sparsity_schedule(const std::string& name);
std::vector<std::string> sparsity_schedule_names();

// p = step / (total_steps - 1), 0 when total_steps == 1. Throws Error unless 0 <= step < total_steps.
double schedule_progress(int64_t step, int64_t total_steps);

// The density for one layer at one step under `config`: 1.0 during dense warm-up
// (step < warmup.dense_steps or layer < warmup.dense_layers), else the schedule's value. A value outside
// (0, 1] (or NaN) from a custom schedule throws Error naming the schedule.
double step_density(const SparseAttnConfig& config, int64_t step, int64_t total_steps, int64_t layer);

}  // namespace tessel
