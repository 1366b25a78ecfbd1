// `tessel eval --config`: the per-head settings of a calibrated config, measured on held-out steps
// with the calibration's own evaluation (evaluate_steps), so a config checks exactly as calibrate
// measured it, on the CPU or all heads at once on a CUDA device.
#include "eval_config.h"

#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "option_checks.h"
#include "quality/calibration.h"
#include "quality/captures.h"
#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/limited_json.h"
#include "tessel/sparse/config.h"

namespace tessel::cli {
namespace {

constexpr uint64_t kMaxConfigFileBytes = 16 << 20;

// The file's per-layer configs (layers[i].sparse_attn), in order, and its metric and target.
struct CalibratedFile {
  std::vector<SparseAttnConfig> layers;
  std::string metric;
  double target = 0.0;
  int64_t heads = 12, head_dim = 64;  // of the captures it was calibrated on ("shape"), else calibrate's defaults
};

int64_t shape_field(const nlohmann::json& shape, const char* key, int64_t fallback, const std::string& who) {
  if (!shape.contains(key)) return fallback;
  const nlohmann::json& v = shape[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 1) fail_argument(who + " shape." + key, "an integer >= 1", json_excerpt(v));
  return v.get<int64_t>();
}

CalibratedFile read_calibrated_file(const std::string& path) {
  const std::string who = "--config " + path;
  const nlohmann::json j = parse_json_limited(read_file_bounded(path, kMaxConfigFileBytes, "--config"),
                                              JsonLimits{kMaxConfigFileBytes, 32}, who);
  if (!j.is_object() || !j.contains("layers") || !j["layers"].is_array() || j["layers"].empty())
    fail_argument(who, "the JSON `tessel calibrate --out` writes: an object with a non-empty \"layers\" array", json_excerpt(j));
  CalibratedFile f;
  if (j.contains("metric")) {
    if (!j["metric"].is_string()) fail_argument(who + " metric", "rel_l2 or cosine", json_excerpt(j["metric"]));
    f.metric = j["metric"].get<std::string>();
  }
  if (j.contains("target")) {
    if (!j["target"].is_number()) fail_argument(who + " target", "a number > 0", json_excerpt(j["target"]));
    f.target = j["target"].get<double>();
  }
  if (j.contains("shape")) {
    if (!j["shape"].is_object()) fail_argument(who + " shape", "an object", json_excerpt(j["shape"]));
    f.heads = shape_field(j["shape"], "heads", f.heads, who);
    f.head_dim = shape_field(j["shape"], "head_dim", f.head_dim, who);
  }
  for (size_t i = 0; i < j["layers"].size(); ++i) {
    const nlohmann::json& entry = j["layers"][i];
    const std::string field = detail::concat(who, " layers[", i, "].sparse_attn");
    if (!entry.is_object() || !entry.contains("sparse_attn") || !entry["sparse_attn"].is_object())
      fail_argument(field, "a sparse-attention config object", json_excerpt(entry));
    try {
      f.layers.push_back(parse_sparse_attn_json(entry["sparse_attn"].dump()));
    } catch (const Error& e) {
      throw Error(field + ": " + e.what());
    }
  }
  return f;
}

// The captured steps of every layer: files per layer (as many --layer as the config has layers),
// or synthetic held-out captures for each of its layers.
void check_held_out_source(const EvalConfigArgs& a, const CalibratedFile& file) {
  const bool synthetic = !a.grid.empty();
  if (synthetic == !a.layers.empty()) fail_argument("--layer / --grid (with --config)", "exactly one of them", synthetic ? "both" : "neither");
  if (!synthetic && a.layers.size() != file.layers.size())
    fail_argument("--layer", detail::concat(file.layers.size(), " values (one per layer of --config ", a.config, ")"), a.layers.size());
}

// One layer's held-out steps (the layers are checked one at a time: a 40-layer config at Wan 14B's
// 720p shape would not fit all at once).
std::vector<CalibrationSample> held_out_steps(const EvalConfigArgs& a, const CalibratedFile& file, const Device& device, size_t layer) {
  if (a.grid.empty()) return load_capture_files(a.layers[layer], "--layer", device);
  const SyntheticCaptureOptions o{a.grid, static_cast<int64_t>(file.layers.size()), a.heads.value_or(file.heads),
                                  a.head_dim.value_or(file.head_dim)};
  return std::move(
      synthetic_layer_captures(o, kSyntheticHeldoutSeedOffset + a.seed, a.synthetic_steps, device, static_cast<int64_t>(layer), 1).front());
}

// Memory and work of the check: one layer's steps (q, k, v, the dense and the sparse output) at a
// time; a dense reference and one block-sparse pass (counted at density 0.5) per step and layer.
// capture_steps: capture files per layer (from the checked --layer lists).
WorkEstimate eval_config_estimate(const EvalConfigArgs& a, const CalibratedFile& file, const Device& device, size_t capture_steps) {
  CaptureShape shape;
  double steps = static_cast<double>(a.synthetic_steps);
  if (!a.grid.empty()) {
    const TokenGrid grid = parse_token_grid(a.grid, "--grid");
    const int64_t heads = a.heads.value_or(file.heads), head_dim = a.head_dim.value_or(file.head_dim);
    shape = {1, grid.numel(), grid.numel(), heads, heads, head_dim};
  } else {
    shape = capture_shape(a.layers.front(), "--layer");
    steps = static_cast<double>(capture_steps);
  }
  const CaptureSizes sizes = capture_sizes(shape, device.is_cuda() ? 2.0 : 4.0);
  const double q_bytes = sizes.q_bytes, kv_bytes = sizes.kv_bytes;
  WorkEstimate e;
  e.device_bytes = device.is_cuda() ? steps * (3.0 * q_bytes + 2.0 * kv_bytes) : 0.0;
  e.host_bytes = device.is_cuda() ? steps * (q_bytes + 2.0 * kv_bytes) : steps * (3.0 * q_bytes + 2.0 * kv_bytes);
  e.flop = static_cast<double>(file.layers.size()) * steps * 1.5 * sizes.attention_flop;
  return e;
}

struct LayerResult {
  CalibratedSetting setting;
  StepsEvaluation eval;
};

// A (layer, head, step) whose error is over the target.
struct Miss {
  size_t layer, head, step;
  double error;
};

nlohmann::json layer_json(size_t layer, const LayerResult& r, double target) {
  nlohmann::json steps = nlohmann::json::array(), heads = nlohmann::json::array();
  for (size_t s = 0; s < r.eval.steps.size(); ++s)
    steps.push_back({{"step", s}, {"density", r.eval.steps[s].density}, {"error", r.eval.steps[s].error},
                     {"head_error", r.eval.steps[s].head_error}});
  for (size_t h = 0; h < r.setting.per_head.size(); ++h)
    heads.push_back({{"head", h},
                     {"value", r.setting.per_head[h]},
                     {"density", h < r.eval.head_density.size() ? r.eval.head_density[h] : r.eval.density},
                     {"error", r.eval.head_error[h]},
                     {"meets_target", r.eval.head_error[h] <= target}});
  double worst_head = 0.0;
  for (double e : r.eval.head_error) worst_head = std::max(worst_head, e);
  return {{"layer", layer},          {"density", r.eval.density},
          {"error", r.eval.error},   {"worst_head_error", worst_head},
          {"meets_target", worst_head <= target},
          {"predicted_speedup", 1.0 / r.eval.density},
          {"heads", heads},          {"steps", steps}};
}

void print_table(const EvalConfigArgs& a, const std::vector<LayerResult>& results, const std::string& metric, double target,
                 double mean_density) {
  std::cout << "config " << a.config << ": " << metric << " <= " << target << " per head on " << results[0].eval.steps.size()
            << " held-out step(s) per layer (" << a.device << ")\n";
  std::cout << std::left << std::setw(7) << "layer" << std::right << std::setw(10) << "density" << std::setw(10) << "error"
            << std::setw(12) << "worst_head" << std::setw(10) << "speedup" << "  target\n";
  for (size_t layer = 0; layer < results.size(); ++layer) {
    const StepsEvaluation& e = results[layer].eval;
    double worst_head = 0.0;
    for (double x : e.head_error) worst_head = std::max(worst_head, x);
    std::cout << std::left << std::setw(7) << layer << std::right << std::fixed << std::setprecision(3) << std::setw(10) << e.density
              << std::setprecision(4) << std::setw(10) << e.error << std::setw(12) << worst_head << std::setprecision(2)
              << std::setw(10) << 1.0 / e.density << "  " << (worst_head <= target ? "met" : "MISSED") << "\n";
  }
  std::cout << "mean density " << std::setprecision(3) << mean_density << ", predicted attention speedup " << std::setprecision(2)
            << 1.0 / mean_density << "x\n";
}

}  // namespace

int run_eval_config(const EvalConfigArgs& a) {
  const Device device = budget_device(a.budget, a.device, "--device");
  const CalibratedFile file = read_calibrated_file(a.config);
  // --metric and --target override the file's (a config may be checked against a stricter target).
  const std::string metric_name = !a.metric.empty() ? a.metric : !file.metric.empty() ? file.metric : std::string("rel_l2");
  CalibrationMetric metric{};
  try {
    metric = parse_calibration_metric(metric_name);
  } catch (const Error& e) {
    throw Error((a.metric.empty() ? "--config " + a.config + " metric" : std::string("--metric")) + ": " + e.what());
  }
  const double target = a.target > 0.0 ? a.target : file.target;
  if (!(target > 0.0)) fail_argument("--target", "a number > 0 (the config file has none)", target);

  check_held_out_source(a, file);
  size_t capture_steps = 0;  // every list checked before any work; the first one's length is what the estimate counts
  for (const std::string& files : a.layers) {
    const size_t count = split_capture_files(files, "--layer").size();
    if (capture_steps == 0) capture_steps = count;
  }
  const std::string shape_flags =
      !a.grid.empty() ? detail::concat("--grid ", a.grid, " --synthetic-heldout ", a.synthetic_steps, " (", file.layers.size(), " layers of --config)")
                      : detail::concat("--layer (", a.layers.size(), " layers of captures)");
  if (!check_work_budget(eval_config_estimate(a, file, device, capture_steps), a.budget, device, 0, shape_flags, "eval --config"))
    return 0;
  const ExecContext ctx;
  std::vector<LayerResult> results;
  std::vector<Miss> misses;
  double mean_density = 0.0;
  for (size_t layer = 0; layer < file.layers.size(); ++layer) {
    std::vector<CalibrationSample> steps = held_out_steps(a, file, device, layer);
    const int64_t heads = steps.front().q.size(2);
    LayerResult r;
    try {
      r.setting = calibrated_setting(file.layers[layer], heads, detail::concat("--config ", a.config, " layers[", layer, "].sparse_attn"));
    } catch (const Error& e) {
      // The config may be right and the captures of another model: name both.
      const std::string captures = a.grid.empty() ? "--layer " + quoted_excerpt(a.layers[layer], 200) : "--grid " + a.grid;
      throw Error(detail::concat(captures, " (captures of ", heads, " heads) against ", e.what()));
    }
    r.setting.options.metric = metric;
    r.setting.options.target = target;
    r.eval = evaluate_steps(ctx, steps, r.setting.per_head, r.setting.options);
    steps.clear();  // the layer's captures (and their outputs) go before the next layer's work
    for (size_t s = 0; s < r.eval.steps.size(); ++s)
      for (size_t h = 0; h < r.eval.steps[s].head_error.size(); ++h)
        if (!(r.eval.steps[s].head_error[h] <= target)) misses.push_back({layer, h, s, r.eval.steps[s].head_error[h]});
    mean_density += r.eval.density / static_cast<double>(file.layers.size());
    results.push_back(std::move(r));
  }

  if (a.json) {
    nlohmann::json out{{"config", a.config}, {"metric", metric_name}, {"target", target}, {"device", a.device}};
    out["layers"] = nlohmann::json::array();
    for (size_t layer = 0; layer < results.size(); ++layer) out["layers"].push_back(layer_json(layer, results[layer], target));
    out["mean_density"] = mean_density;
    // Block-sparse attention time follows the kept blocks: the ideal speedup over dense is 1/density.
    out["predicted_speedup"] = 1.0 / mean_density;
    out["misses"] = nlohmann::json::array();
    for (const Miss& m : misses) out["misses"].push_back({{"layer", m.layer}, {"head", m.head}, {"step", m.step}, {"error", m.error}});
    std::cout << out.dump(2) << "\n";
  } else {
    print_table(a, results, metric_name, target, mean_density);
  }
  if (misses.empty()) return 0;
  std::cerr << (a.report_only ? "eval --config (report only): " : "eval --config: ") << "target " << metric_name << " <= " << target
            << " missed by " << misses.size() << " (layer, head, step):";
  for (size_t i = 0; i < misses.size() && i < 20; ++i)
    std::cerr << (i ? "," : "") << " layer " << misses[i].layer << " head " << misses[i].head << " step " << misses[i].step << " ("
              << misses[i].error << ")";
  std::cerr << (misses.size() > 20 ? ", ..." : "") << "\n";
  return a.report_only ? 0 : 1;
}

}  // namespace tessel::cli
