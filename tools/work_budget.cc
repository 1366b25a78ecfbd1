#include "work_budget.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <optional>

#include <sys/resource.h>

#include "device_memory.h"
#include "option_checks.h"
#include "tessel/core/error.h"
#include "tessel/core/parallel.h"
#include "tessel/dit/wan_flop.h"
#include "tessel/dit/wan_weights.h"

namespace tessel::cli {


double wan_cpu_activation_bytes(const WanConfig& config, double rows) {
  return 4.0 * rows * (10.0 * static_cast<double>(config.inner_dim()) + static_cast<double>(config.ffn_dim));
}

double wan_cpu_weight_bytes(const WanConfig& config) { return 8.0 * wan_parameter_count(config); }
double wan_cuda_weight_bytes(const WanConfig& config, bool fp8) {
  double bytes = 0.0;
  for (const WeightSpec& spec : wan_weight_specs(config)) {
    const double numel = static_cast<double>(shape_numel(spec.shape));
    bytes += fp8 && wan_fp8_weight(spec.name) ? numel + 4.0 * static_cast<double>(spec.shape[0]) : 2.0 * numel;
  }
  return bytes;
}

double wan_cuda_activation_bytes(const WanConfig& config, double rows, bool fp8, bool fp8_attention) {
  const double dim = static_cast<double>(config.inner_dim()), ffn = static_cast<double>(config.ffn_dim);
  return rows * (4.0 * dim + 2.0 * 5.0 * dim + 2.0 * ffn + (fp8 ? std::max(dim, ffn) + 4.0 : 0.0) + (fp8_attention ? 3.0 * dim : 0.0));
}

namespace {
constexpr double kMaxSeconds = 3600.0;  // beyond: --force
constexpr double kAnnounceSeconds = 10.0;
}  // namespace

std::vector<CLI::Option*> add_budget_flags(CLI::App& app, BudgetFlags& flags, const std::string& prefix) {
  return {app.add_option("--max-memory", flags.max_memory,
                         prefix + "host memory budget, e.g. 64G or 512M (default: half of this machine's memory); runs estimated over it are refused")
              ->check(parsed_by("a memory size such as 64G", [](const std::string& text) { parse_memory_size(text); })),
          app.add_flag("--force", flags.force, prefix + "run even when the estimated memory or time is over its budget"),
          app.add_flag("--dry-run", flags.dry_run,
                       prefix + "print the estimated memory and time and whether the budgets admit them, then stop (a CUDA device "
                                "need not be present)")};
}

Device budget_device(const BudgetFlags& budget, const std::string& text, const std::string& flag) {
  if (!budget.dry_run) return present_device(text, flag);
  try {
    return parse_device(text);
  } catch (const Error& e) {
    throw Error(flag + ": " + e.what());
  }
}

double parse_memory_size(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double number = text.empty() ? NAN : std::strtod(text.c_str(), &end);
  double scale = 1.0;
  if (end != nullptr && *end != '\0') {
    const std::string suffix(end);
    if (suffix == "K" || suffix == "k") scale = 1024.0;
    else if (suffix == "M" || suffix == "m") scale = 1024.0 * 1024.0;
    else if (suffix == "G" || suffix == "g") scale = 1024.0 * 1024.0 * 1024.0;
    else if (suffix == "T" || suffix == "t") scale = 1024.0 * 1024.0 * 1024.0 * 1024.0;
    else scale = NAN;
  }
  const double bytes = number * scale;
  if (errno != 0 || !std::isfinite(bytes) || bytes <= 0.0)
    fail_argument("--max-memory", "a size > 0: a number with an optional K, M, G or T suffix (e.g. 64G)", text);
  return bytes;
}

double peak_host_memory_bytes() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return 1024.0 * static_cast<double>(usage.ru_maxrss);  // Linux counts kilobytes
}

double estimated_seconds(double flop, const Device& device, int threads) {
  const double rate = device.is_cuda() ? 300e12 : 50e9 * std::max(1, threads > 0 ? threads : max_threads());
  return flop / rate;
}

bool check_work_budget(const WorkEstimate& estimate, const BudgetFlags& budget, const Device& device, int threads,
                       const std::string& flags, const std::string& what) {
  const double host_budget = budget.max_memory.empty() ? static_cast<double>(memory_budget_bytes()) : parse_memory_size(budget.max_memory);
  const double seconds = estimated_seconds(estimate.flop, device, threads);
  const std::string summary = "about " + format_bytes(estimate.host_bytes) + " of host memory" +
                              (device.is_cuda() ? ", " + format_bytes(estimate.device_bytes) + " on " + device.str() : "") + " and " +
                              detail::concat(std::round(estimate.flop / 1e9) / 1e3) + " TFLOP (~" +
                              detail::concat(std::round(seconds)) + " s on " + (device.is_cuda() ? "the GPU" : "this CPU") + ")";
  // A dry run may size a GPU this machine lacks: its memory is then not compared.
  const std::optional<DeviceMemory> memory = device.is_cuda() && cuda_available() ? device_memory(device) : std::nullopt;
  const std::string host_limit = format_bytes(host_budget) + (budget.max_memory.empty() ? " (half of this machine's memory)" : " (--max-memory)");
  if (!budget.force) {
    const auto refuse = [&](const std::string& over) {
      throw Error(flags + ": " + what + " needs " + summary + ", " + over + "; ask for less, or pass --force" +
                  (budget.max_memory.empty() ? " (or raise the host budget with --max-memory)" : ""));
    };
    if (estimate.host_bytes > host_budget) refuse("over the host memory budget of " + host_limit);
    if (memory && estimate.device_bytes > static_cast<double>(memory->total))
      refuse("more than " + device.str() + "'s " + format_bytes(static_cast<double>(memory->total)));
    if (seconds > kMaxSeconds) refuse("over the hour a run may take without --force");
  }
  if (budget.dry_run) {
    const std::string device_limit = !device.is_cuda() ? "no device"
                                     : memory          ? device.str() + "'s " + format_bytes(static_cast<double>(memory->total))
                                                       : device.str() + " not present here: its memory not compared";
    std::printf("%s: %s; %s (host budget %s, %s, an hour)\n", what.c_str(), summary.c_str(),
                budget.force ? "--force: no budget applies" : "within the budgets", host_limit.c_str(), device_limit.c_str());
    return false;
  }
  if (seconds > kAnnounceSeconds) std::fprintf(stderr, "%s: %s\n", what.c_str(), summary.c_str());
  return true;
}

}  // namespace tessel::cli
