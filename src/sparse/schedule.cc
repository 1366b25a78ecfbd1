#include "tessel/sparse/schedule.h"

#include <cmath>
#include <map>
#include <mutex>

#include "tessel/core/error.h"

namespace tessel {
namespace {

constexpr const char* kBuiltinNames[] = {"constant", "conservative", "aggressive"};

bool is_builtin(const std::string& name) {
  for (const char* builtin : kBuiltinNames)
    if (name == builtin) return true;
  return false;
}

struct ScheduleTable {
  std::mutex mutex;
  std::map<std::string, SparsitySchedule> schedules;

  ScheduleTable() {
    schedules["constant"] = [](int64_t, int64_t, double topk_ratio) { return topk_ratio; };
    schedules["conservative"] = [](int64_t step, int64_t total, double) {
      const double p = schedule_progress(step, total);
      return p < 0.2 ? 1.0 : 1.0 - 0.7 * (p - 0.2) / 0.8;
    };
    schedules["aggressive"] = [](int64_t step, int64_t total, double) {
      return 0.2 + 0.3 * schedule_progress(step, total);
    };
  }
};

ScheduleTable& table() {
  static ScheduleTable instance;
  return instance;
}

}  // namespace

void register_sparsity_schedule(const std::string& name, SparsitySchedule schedule) {
  if (name.empty()) fail_argument("schedule name", "a non-empty name", "''");
  if (!schedule) fail_argument("schedule '" + name + "'", "a callable function", "an empty function");
  if (is_builtin(name)) fail_argument("schedule name", "a name other than the built-ins constant, conservative, aggressive", "'" + name + "'");
  ScheduleTable& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.schedules[name] = std::move(schedule);
}

const SparsitySchedule& get_sparsity_schedule(const std::string& name) {
  ScheduleTable& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  const auto it = t.schedules.find(name);
  if (it == t.schedules.end()) {
    std::string names;
    for (const auto& [known, fn] : t.schedules) names += (names.empty() ? "" : ", ") + known;
    fail_argument("schedule", "one of " + names, quoted_excerpt(name));
  }
  return it->second;  // std::map nodes are stable; entries are replaced, never erased
}

bool has_sparsity_schedule(const std::string& name) {
  ScheduleTable& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.schedules.count(name) != 0;
}

std::vector<std::string> sparsity_schedule_names() {
  ScheduleTable& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  std::vector<std::string> names;
  for (const auto& [name, fn] : t.schedules) names.push_back(name);
  return names;
}

double schedule_progress(int64_t step, int64_t total_steps) {
  if (total_steps < 1) fail_argument("total_steps", ">= 1", total_steps);
  if (step < 0 || step >= total_steps)
    fail_argument("step", "in [0, " + std::to_string(total_steps) + ")", step);
  return total_steps == 1 ? 0.0 : static_cast<double>(step) / static_cast<double>(total_steps - 1);
}

double step_density(const SparseAttnConfig& config, int64_t step, int64_t total_steps, int64_t layer) {
  schedule_progress(step, total_steps);  // validates step and total
  if (layer < 0) fail_argument("layer", ">= 0", layer);
  if (step < config.warmup.dense_steps || layer < config.warmup.dense_layers) return 1.0;
  const SparsitySchedule schedule = get_sparsity_schedule(config.schedule);
  const double density = schedule(step, total_steps, config.selection.topk_ratio);
  if (!(density > 0.0 && density <= 1.0))
    fail_argument("schedule '" + config.schedule + "' at step " + std::to_string(step) + " of " + std::to_string(total_steps),
                  "a density in (0, 1]", density);
  return density;
}

}  // namespace tessel
