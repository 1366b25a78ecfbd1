// `tessel eval`: how much each sparse pattern costs in output quality, on synthetic video-DiT
// attention (--grid) or on captured q/k/v (--qkv file.safetensors). For every method and
// parameter it reports the density kept, rel_l2 and cosine of the output against dense
// attention, the estimation time (dynamic methods) and the block-sparse attention time.
// With --config calibrated.json it checks a calibrated per-layer, per-head config on held-out
// steps instead (eval_config.h).
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "command.h"
#include "eval_config.h"
#include "option_checks.h"
#include "work_budget.h"
#include "tessel/core/error.h"
#include "tessel/core/finite_check.h"
#include "tessel/core/parallel.h"
#include "tessel/kernels/attention.h"
#include "tessel/sparse/estimators/head_classifier.h"
#include "tessel/sparse/estimators/topk_estimator.h"
#include "tessel/sparse/estimators/xattention_estimator.h"
#include "tessel/sparse/planners/static_patterns.h"
#include "quality/evaluate_mask.h"
#include "quality/qkv_file.h"
#include "quality/synthetic_video.h"

namespace tessel::cli {
namespace {

struct EvalArgs {
  std::string grid;
  std::string qkv;
  int64_t heads = 12;
  int64_t head_dim = 128;
  double sharpness = 1.0;
  double noise = 0.1;
  uint64_t seed = 0;
  std::vector<std::string> head_types;
  std::vector<std::string> methods{"random", "dynamic_topk", "threshold", "radial", "local", "sliding_window", "spatial_aware"};
  std::vector<double> topk{0.1, 0.2, 0.3, 0.5};
  std::vector<double> topk_per_head;  // one extra dynamic_topk row with these per-head ratios
  std::vector<double> thresholds{0.5, 0.8, 0.9, 0.95};
  std::vector<double> densities;  // random baseline; empty = the --topk list
  std::vector<double> decays{1.0};
  std::vector<int64_t> radii{1, 2};
  std::vector<int64_t> local_windows{3};
  int64_t block_q = 128;
  int64_t block_kv = 64;
  int64_t stride = 8;
  double similarity_threshold = 0.1;
  bool cdf = false;
  std::string ordering = "hilbert";
  int repeats = 1;
  int threads = 0;  // 0 = default
  bool stride_given = false;
  bool json = false;
};

constexpr const char* kMethods[] = {"random", "dynamic_topk", "threshold", "radial", "local", "sliding_window", "spatial_aware",
                                    "head_classify"};

bool uses(const EvalArgs& a, const std::string& method) {
  return std::find(a.methods.begin(), a.methods.end(), method) != a.methods.end();
}

// Relations between options, checked before any data is made or read.
void check_eval_args(const EvalArgs& a) {
  if (a.qkv.empty()) {
    if (a.head_dim % 2 != 0 || a.head_dim < 6) fail_argument("--head-dim", "an even number >= 6 for synthetic data", a.head_dim);
    if (!a.head_types.empty() && static_cast<int64_t>(a.head_types.size()) != a.heads)
      fail_argument("--head-types", detail::concat(a.heads, " types (one per --heads)"), a.head_types.size());
    if (!a.topk_per_head.empty() && static_cast<int64_t>(a.topk_per_head.size()) != a.heads)
      fail_argument("--topk-per-head", detail::concat(a.heads, " ratios (one per --heads)"), a.topk_per_head.size());
  }
  if (uses(a, "threshold") || a.stride_given) {
    require_multiple("--block-q", a.block_q, "--stride", a.stride);
    require_multiple("--block-kv", a.block_kv, "--stride", a.stride);
  }
}

// The rows the report will have: one per method and value of its list.
int64_t eval_method_rows(const EvalArgs& a) {
  int64_t rows = 0;
  for (const std::string& m : a.methods) {
    if (m == "random") rows += static_cast<int64_t>((a.densities.empty() ? a.topk : a.densities).size());
    else if (m == "dynamic_topk") rows += static_cast<int64_t>(a.topk.size()) + (a.topk_per_head.empty() ? 0 : 1);
    else if (m == "threshold") rows += static_cast<int64_t>(a.thresholds.size());
    else if (m == "radial") rows += static_cast<int64_t>(a.decays.size());
    else if (m == "local") rows += static_cast<int64_t>(a.local_windows.size());
    else if (m == "sliding_window" || m == "spatial_aware") rows += static_cast<int64_t>(a.radii.size());
    else rows += 1;
  }
  return rows;
}

// What a shape implies: fp32 q, k, v, the dense output, one method's output and a scratch copy,
// and the block masks; the dense reference once, then every row's estimate and sparse pass
// (--repeats times, once more for the error), counted at half density. `flags` names the shape's
// flags in the refusal. False under --dry-run: the command stops.
[[nodiscard]] bool check_eval_budget(const EvalArgs& a, const BudgetFlags& budget, const std::string& flags, int64_t tokens,
                                     int64_t heads, int64_t head_dim, WorkEstimate& estimate) {
  const double elems = double(tokens) * double(heads) * double(head_dim);
  const double blocks = double(heads) * std::ceil(double(tokens) / double(a.block_q)) * std::ceil(double(tokens) / double(a.block_kv));
  estimate.host_bytes = 6.0 * elems * 4.0 + 8.0 * blocks;
  estimate.flop = 4.0 * double(tokens) * elems * (1.0 + 0.5 * double(a.repeats + 1) * double(eval_method_rows(a)));
  return check_work_budget(estimate, budget, Device::cpu(), a.threads,
                           detail::concat(flags, " (", tokens, " tokens) --heads ", heads, " --head-dim ", head_dim, " --methods ",
                                          eval_method_rows(a), " rows --repeats ", a.repeats),
                           "eval");
}

struct Row {
  std::string method;
  double param = 0.0;
  double density = 0.0, rel_l2 = 0.0, cosine = 0.0, estimate_ms = 0.0, attn_ms = 0.0, plan_ms = 0.0;
};

int run_eval(const EvalArgs& a, const BudgetFlags& budget) {
  check_eval_args(a);
  WorkEstimate estimate;
  if (a.threads > 0) set_num_threads(a.threads);
  Tensor q, k, v;
  std::optional<TokenGrid> grid;
  if (!a.grid.empty()) grid = parse_token_grid(a.grid, "--grid");
  if (a.qkv.empty()) {
    const TokenGrid g = grid.value_or(TokenGrid{9, 16, 16});
    if (!check_eval_budget(a, budget, "--grid " + (a.grid.empty() ? std::string("9x16x16") : a.grid), g.numel(), a.heads, a.head_dim,
                           estimate))
      return 0;
  }
  if (!a.qkv.empty()) {
    QkvTensors t = load_qkv_safetensors(a.qkv);
    if (!check_eval_budget(a, budget, "--qkv " + quoted_excerpt(a.qkv, 200), t.q.size(1), t.q.size(2), t.q.size(3), estimate))
      return 0;
    q = t.q.dtype() == DType::kF32 ? std::move(t.q) : t.q.to(DType::kF32);
    k = t.k.dtype() == DType::kF32 ? std::move(t.k) : t.k.to(DType::kF32);
    v = t.v.dtype() == DType::kF32 ? std::move(t.v) : t.v.to(DType::kF32);
    if (grid && grid->numel() != q.size(1))
      fail_argument("--grid", detail::concat(q.size(1), " tokens (the q tensor's sequence)"), grid->numel());
  } else {
    SyntheticVideoOptions o;
    o.grid = grid.value_or(TokenGrid{9, 16, 16});
    grid = o.grid;
    o.heads = a.heads;
    o.head_dim = a.head_dim;
    o.sharpness = a.sharpness;
    o.noise = a.noise;
    o.seed = a.seed;
    for (const std::string& t : a.head_types) o.head_types.push_back(parse_synthetic_head_type(t));
    SyntheticQkv s = make_synthetic_video_qkv(o);
    q = std::move(s.q);
    k = std::move(s.k);
    v = std::move(s.v);
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"q", &q}, {"k", &k}, {"v", &v}})
      check_finite(t->view(), std::string("synthetic ") + name, "--sharpness or --noise too large");
  }
  const int64_t seq = q.size(1), hq = q.size(2);
  Tensor dense = Tensor::empty(q.shape(), DType::kF32);
  const double dense_ms = median_ms(a.repeats, [&] { attention_forward(ExecContext{}, q.view(), k.view(), v.view(), dense.view(), TensorView{}); });
  check_finite(dense.view(), "dense attention output", "the inputs overflow fp32 attention (scores too large)");

  std::vector<Row> rows;
  auto add = [&](const std::string& method, double param, const BlockMask& mask, const TokenPermutation* perm, double estimate_ms,
                 double plan_ms) {
    const MaskEvaluation e = evaluate_mask(ExecContext{}, q.view(), k.view(), v.view(), dense.view(), mask, perm, a.repeats);
    // A non-finite metric is no measurement: refuse rather than print a plausible-looking table.
    for (const auto& [metric, value] : {std::pair<const char*, double>{"rel_l2", e.error.rel_l2}, {"cosine", e.error.cosine}, {"density", e.density}})
      if (!std::isfinite(value))
        throw Error(detail::concat("eval: ", method, " (param ", param, "): ", metric, " is ", value,
                                   " (the sparse output has non-finite values)"));
    rows.push_back({method, param, e.density, e.error.rel_l2, e.error.cosine, estimate_ms, e.attn_ms, plan_ms});
  };
  auto add_static = [&](const std::string& method, double param, const StaticPattern& pattern) {
    if (!grid) return;
    StaticPlanRequest request;
    request.layout.grid = *grid;
    request.block_q = a.block_q;
    request.block_kv = a.block_kv;
    std::optional<StaticPlan> plan;
    const double plan_ms = median_ms(1, [&] { plan = plan_static_pattern(pattern, request); });
    add(method, param, plan->mask, plan->permuted() ? &plan->permutation : nullptr, 0.0, plan_ms);
  };
  const SpatialOrdering ordering = parse_spatial_ordering(a.ordering);
  for (const std::string& method : a.methods) {
    if (method == "random") {
      const BlockMaskShape shape{1, hq, seq, k.size(1), a.block_q, a.block_kv};
      for (double d : a.densities.empty() ? a.topk : a.densities) add("random", d, BlockMask::random(shape, d, a.seed + 17), nullptr, 0.0, 0.0);
    } else if (method == "dynamic_topk") {
      TopkEstimatorOptions o;
      o.block_q = a.block_q;
      o.block_kv = a.block_kv;
      o.similarity_threshold = a.similarity_threshold;
      for (double t : a.topk) {
        (a.cdf ? o.cdf_threshold : o.topk_ratio) = t;
        EstimateResult r = estimate_topk_mask(ExecContext{}, q.view(), k.view(), o);
        const double ms = median_ms(a.repeats - 1, [&] { r = estimate_topk_mask(ExecContext{}, q.view(), k.view(), o); });
        add("dynamic_topk", t, r.mask, nullptr, a.repeats > 1 ? ms : r.estimate_ms, 0.0);
      }
      if (!a.topk_per_head.empty()) {
        o.per_head = a.topk_per_head;
        EstimateResult r = estimate_topk_mask(ExecContext{}, q.view(), k.view(), o);
        double mean = 0.0;
        for (double x : a.topk_per_head) mean += x / static_cast<double>(a.topk_per_head.size());
        add("dynamic_topk_per_head", mean, r.mask, nullptr, r.estimate_ms, 0.0);
      }
    } else if (method == "threshold") {
      XAttentionOptions o;
      o.block_q = a.block_q;
      o.block_kv = a.block_kv;
      o.stride = a.stride;
      for (double t : a.thresholds) {
        o.threshold = t;
        EstimateResult r = estimate_xattention_mask(ExecContext{}, q.view(), k.view(), o);
        const double ms = median_ms(a.repeats - 1, [&] { r = estimate_xattention_mask(ExecContext{}, q.view(), k.view(), o); });
        add("threshold", t, r.mask, nullptr, a.repeats > 1 ? ms : r.estimate_ms, 0.0);
      }
    } else if (method == "radial") {
      for (double d : a.decays) add_static("radial", d, StaticPattern{RadialPattern{d, true}});
    } else if (method == "local") {
      for (int64_t w : a.local_windows) add_static("local", static_cast<double>(w), StaticPattern{LocalPattern{w}});
    } else if (method == "sliding_window") {
      for (int64_t r : a.radii) add_static("sliding_window", static_cast<double>(r), StaticPattern{SlidingWindow3dPattern{1, r, r}});
    } else if (method == "spatial_aware") {
      for (int64_t r : a.radii) add_static("spatial_aware", static_cast<double>(r), StaticPattern{SpatialAwarePattern{r, 3, ordering}});
    } else if (method == "head_classify" && grid) {
      for (int64_t r : a.radii) {  // the spatial heads' window radius; the classes' token order is Hilbert
        HeadClassifierOptions o;
        o.spatial_radius = r;
        o.block_q = a.block_q;
        o.block_kv = a.block_kv;
        std::optional<HeadClassPlans> plans;
        const double plan_ms = median_ms(1, [&] { plans = plan_head_classes(TokenLayout{*grid, 0, true}, o); });
        HeadProbe probe;
        const double probe_ms = median_ms(1, [&] { probe = probe_head_classes(ExecContext{}, q.view(), k.view(), *plans, o); });
        add("head_classify", static_cast<double>(r), head_class_mask(*plans, probe.classes),
            plans->plan.permuted() ? &plans->plan.permutation : nullptr, probe_ms, plan_ms);
      }
    }
  }

  if (a.json) {
    nlohmann::json out;
    out["config"] = {{"source", a.qkv.empty() ? "synthetic" : a.qkv},
                     {"grid", grid ? nlohmann::json{grid->frames, grid->height, grid->width} : nlohmann::json(nullptr)},
                     {"batch", q.size(0)},
                     {"seq", seq},
                     {"heads", hq},
                     {"kv_heads", k.size(2)},
                     {"head_dim", q.size(3)},
                     {"block_q", a.block_q},
                     {"block_kv", a.block_kv},
                     {"stride", a.stride},
                     {"sharpness", a.sharpness},
                     {"noise", a.noise},
                     {"seed", a.seed},
                     {"threads", max_threads()},
                     {"repeats", a.repeats},
                     {"dense_ms", dense_ms}};
    out["results"] = nlohmann::json::array();
    for (const Row& r : rows)
      out["results"].push_back({{"method", r.method}, {"param", r.param}, {"density", r.density}, {"rel_l2", r.rel_l2},
                                {"cosine", r.cosine}, {"estimate_ms", r.estimate_ms}, {"attn_ms", r.attn_ms}, {"plan_ms", r.plan_ms}});
    out["estimated_host_memory_bytes"] = estimate.host_bytes;
    out["peak_host_memory_bytes"] = peak_host_memory_bytes();
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << "q " << shape_str(q.shape()) << " k " << shape_str(k.shape()) << ", blocks " << a.block_q << "x" << a.block_kv
            << ", dense attention " << std::fixed << std::setprecision(1) << dense_ms << " ms (" << max_threads() << " threads)\n";
  std::cout << std::left << std::setw(16) << "method" << std::right << std::setw(8) << "param" << std::setw(10) << "density"
            << std::setw(10) << "rel_l2" << std::setw(10) << "cosine" << std::setw(12) << "estimate_ms" << std::setw(10) << "attn_ms"
            << std::setw(10) << "plan_ms" << "\n";
  for (const Row& r : rows)
    std::cout << std::left << std::setw(16) << r.method << std::right << std::setprecision(3) << std::setw(8) << r.param
              << std::setw(10) << r.density << std::setprecision(4) << std::setw(10) << r.rel_l2 << std::setw(10) << r.cosine
              << std::setprecision(2) << std::setw(12) << r.estimate_ms << std::setw(10) << r.attn_ms << std::setw(10) << r.plan_ms
              << "\n";
  return 0;
}

CommandRegistration registration{
    "eval", "Measure the output error of sparse patterns against dense attention", [](CLI::App& app) {
      auto a = std::make_shared<EvalArgs>();
      app.add_option("--grid", a->grid, "Latent token grid FxHxW (synthetic data; default 9x16x16), or the layout of --qkv")
          ->check(parsed_by("FxHxW or HxW with positive integers", [](const std::string& text) { parse_token_grid(text, "--grid"); }));
      app.add_option("--qkv", a->qkv, "safetensors file with q, k, v (BSHD, F32/F16/BF16)");
      const CLI::Validator ratio = number_in(0.0, 1.0, Bounds::kOpenLow);
      app.add_option("--heads", a->heads, "Synthetic: heads")->check(integer_in(1, kMaxHeads));
      app.add_option("--head-dim", a->head_dim, "Synthetic: head dimension (even, >= 6)")->check(integer_in(6, kMaxHeadDim));
      app.add_option("--sharpness", a->sharpness, "Synthetic: logit scale in (0, 100] (higher = more local)")
          ->check(number_in(0.0, 100.0, Bounds::kOpenLow));
      app.add_option("--noise", a->noise, "Synthetic: content logit noise relative to the peak logit, in [0, 100]")
          ->check(number_in(0.0, 100.0));
      app.add_option("--head-types", a->head_types, "Synthetic: one type per head (spatial, temporal, sink, diffuse); default mix")
          ->delimiter(',')
          ->check(one_of({"spatial", "temporal", "sink", "diffuse"}));
      app.add_option("--seed", a->seed, "Synthetic and random-mask seed")->check(integer_in(0, INT64_MAX));
      app.add_option("--methods", a->methods, "random, dynamic_topk, threshold, radial, local, sliding_window, spatial_aware, head_classify")
          ->delimiter(',')
          ->check(one_of({std::begin(kMethods), std::end(kMethods)}));
      app.add_option("--topk", a->topk, "dynamic_topk ratios (or cdf thresholds with --cdf), in (0, 1]")->delimiter(',')->check(ratio);
      app.add_option("--topk-per-head", a->topk_per_head,
                     "dynamic_topk: one more run with these per-head ratios in (0, 1] (param = their mean)")
          ->delimiter(',')
          ->check(ratio);
      app.add_option("--threshold", a->thresholds, "threshold (XAttention) tau values in (0, 1]")->delimiter(',')->check(ratio);
      app.add_option("--densities", a->densities, "random baseline densities in (0, 1] (default: the --topk list)")
          ->delimiter(',')
          ->check(ratio);
      app.add_option("--decay", a->decays, "radial decay factors in (0, 16]")->delimiter(',')->check(number_in(0.0, 16.0, Bounds::kOpenLow));
      app.add_option("--radius", a->radii, "sliding_window / spatial_aware radii in patches (head_classify: its spatial heads' radius)")->delimiter(',')->check(integer_in(0, 1 << 20));
      app.add_option("--local-window", a->local_windows, "local window sizes in frames")->delimiter(',')->check(integer_in(1, 1 << 20));
      app.add_option("--block-q", a->block_q, "Query block size")->check(integer_in(1, kMaxBlockTokens));
      app.add_option("--block-kv", a->block_kv, "Key block size")->check(integer_in(1, kMaxBlockTokens));
      app.add_option("--stride", a->stride, "XAttention antidiagonal stride (8 or 16)")->check(one_of({"8", "16"}))->each([a](const std::string&) {
        a->stride_given = true;
      });
      app.add_option("--similarity-threshold", a->similarity_threshold, "dynamic_topk self-similarity threshold in [-1, 1]")
          ->check(number_in(-1.0, 1.0));
      app.add_flag("--cdf", a->cdf, "dynamic_topk: --topk values are cumulative-probability thresholds");
      app.add_option("--ordering", a->ordering, "spatial_aware token ordering: raster, hilbert, z_curve")
          ->check(one_of({"raster", "hilbert", "z_curve"}));
      app.add_option("--repeats", a->repeats, "Timed runs per measurement (median)")->check(integer_in(1, 1000));
      app.add_option("--threads", a->threads, "CPU threads (default: all)")->check(integer_in(1, kMaxThreads));
      app.add_flag("--json", a->json, "Print JSON {config, results} (with --config: the per-layer and per-head report)");
      auto c = std::make_shared<EvalConfigArgs>();
      app.add_option("--config", c->config, "Check this config of `tessel calibrate --out` on held-out steps (--layer files or --grid)")
          ->check(non_empty_path());
      app.add_option("--layer", c->layers, "--config: one layer's held-out capture files (safetensors q, k, v), comma-separated; one per layer");
      app.add_option("--synthetic-heldout", c->synthetic_steps, "--config with --grid: synthetic held-out steps per layer")
          ->capture_default_str()
          ->check(integer_in(1, 1000));
      app.add_option("--device", c->device, "--config: cpu (fp32), or cuda / cuda:N (bf16, every head on the GPU at once)")
          ->capture_default_str();
      app.add_option("--metric", c->metric, "--config: rel_l2 or cosine (default: the config's)")->check(one_of({"rel_l2", "cosine"}));
      app.add_option("--target", c->target, "--config: largest allowed error per head and step (default: the config's)")
          ->check(number_in(0.0, 10.0, Bounds::kOpenLow));
      app.add_flag("--report-only", c->report_only, "--config: report a missed target without failing (exit status 0)");
      add_budget_flags(app, c->budget);
      CLI::Option* heads = app.get_option("--heads");
      CLI::Option* head_dim = app.get_option("--head-dim");
      std::vector<const CLI::Option*> config_only, plain_only;
      for (const char* name : {"--synthetic-heldout", "--device", "--metric", "--target", "--report-only"})
        config_only.push_back(app.get_option(name));
      for (const char* name : {"--methods", "--topk", "--threshold", "--cdf", "--ordering", "--repeats"})
        plain_only.push_back(app.get_option(name));
      return CommandRunner([a, c, heads, head_dim, config_only, plain_only] {
        for (const CLI::Option* option : config_only) check_applies(option, !c->config.empty(), "--config");
        for (const CLI::Option* option : plain_only) check_applies(option, c->config.empty(), "eval without --config");
        if (c->config.empty()) {
          if (!c->layers.empty()) fail_argument("--layer", "given with --config", "without it");
          return run_eval(*a, c->budget);
        }
        if (!a->qkv.empty()) fail_argument("--qkv", "not given with --config (held-out steps come from --layer or --grid)", a->qkv);
        c->grid = a->grid;
        c->seed = a->seed;
        c->json = a->json;
        if (heads->count() > 0) c->heads = a->heads;
        if (head_dim->count() > 0) c->head_dim = a->head_dim;
        if (a->threads > 0) set_num_threads(a->threads);
        return run_eval_config(*c);
      });
    }};

}  // namespace
}  // namespace tessel::cli
