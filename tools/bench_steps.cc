#include "bench_steps.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "bench_timer.h"
#include "option_checks.h"
#include "sparse_attn_flags.h"
#include "tessel/core/error.h"
#include "tessel/core/parallel.h"
#include "tessel/core/random.h"
#include "tessel/kernels/reference.h"
#include "tessel/sparse/sparse_attention.h"

namespace tessel::cli {
StepsReport run_denoising_steps(const BenchConfig& c, const StepsConfig& s) {
  if (s.steps < 1) fail_argument("--steps", ">= 1", s.steps);
  if (s.layers < 1) fail_argument("--layers", ">= 1", s.layers);
  if (c.iters < 1) fail_argument("--iters", ">= 1", c.iters);
  if (c.warmup < 0) fail_argument("--warmup", ">= 0", c.warmup);
  present_device(c.device, "--device");
  s.sparse.validate();
  if (c.threads > 0) set_num_threads(c.threads);

  const int64_t kv_heads = c.effective_kv_heads(), seq_kv = c.effective_seq_kv();
  Tensor q_host = Tensor::empty({c.batch, c.seq, c.heads, c.head_dim}, c.dtype);
  Tensor k_host = Tensor::empty({c.batch, seq_kv, kv_heads, c.head_dim}, c.dtype);
  Tensor v_host = Tensor::empty({c.batch, seq_kv, kv_heads, c.head_dim}, c.dtype);
  const Tensor out = Tensor::empty(q_host.shape(), c.dtype, c.device);

  const auto cache = std::make_shared<PlanCache>();
  const std::unique_ptr<BackendRegistry> registry = make_cli_registry();
  std::vector<SparseAttention> layers;
  layers.reserve(static_cast<size_t>(s.layers));
  for (int64_t layer = 0; layer < s.layers; ++layer) {
    SparseAttentionOptions o;
    o.num_heads = c.heads;
    o.num_kv_heads = kv_heads;
    o.head_dim = c.head_dim;
    o.config = s.sparse;
    o.backend_override = s.backend_override;
    o.dtype = c.dtype;
    o.device = c.device;
    o.layer_index = layer;
    o.plan_cache = cache;
    o.registry = registry.get();
    layers.emplace_back(o);
  }
  const Resolution& resolution = layers.front().resolution();

  StepsReport report;
  report.bench = c;
  report.steps = s;
  report.backend = resolution.backend ? resolution.backend->name() : "none";
  report.origin = resolution.backend ? resolution.backend->origin() : "";
  report.source = std::string(resolution_source_name(resolution.source));

  ExecContext ctx;
  ctx.device = c.device;
  ctx.num_threads = c.threads;
  auto timer = make_bench_timer(ctx);
  for (int64_t step = 0; step < s.steps; ++step) {
    // The latents change every step; fresh inputs stand in for them.
    fill_normal(q_host.view(), c.seed * 7 + 3 * static_cast<uint64_t>(step) + 1);
    fill_normal(k_host.view(), c.seed * 7 + 3 * static_cast<uint64_t>(step) + 2);
    fill_normal(v_host.view(), c.seed * 7 + 3 * static_cast<uint64_t>(step) + 3);
    const Tensor q = q_host.to(c.device), k = k_host.to(c.device), v = v_host.to(c.device);

    std::vector<AttentionStepReport> reports(layers.size());
    const auto run_step = [&] {
      for (size_t l = 0; l < layers.size(); ++l)
        reports[l] = layers[l].forward(ctx, StepInfo::at(step, s.steps, static_cast<int64_t>(l)), q, k, v, out);
    };
    for (int i = 0; i < (step == 0 ? c.warmup : 0); ++i) run_step();
    std::vector<double> times;
    for (int i = 0; i < c.iters; ++i) {
      timer->start();
      run_step();
      times.push_back(timer->stop_ms());
    }
    StepResult result;
    result.step = step;
    result.ms = median(times);
    result.backend = reports.back().backend;
    double density_sum = 0.0;
    for (const AttentionStepReport& r : reports) {
      result.dense_layers += r.dense ? 1 : 0;
      density_sum += r.density;
      result.estimate_ms += r.estimate_ms;
    }
    result.density = density_sum / static_cast<double>(reports.size());
    result.rel_err_vs_dense = sampled_relative_error(c, q_host, k_host, v_host, nullptr, {}, out);
    report.results.push_back(result);
  }
  report.plan_cache_hits = cache->hits();
  report.plan_cache_misses = cache->misses();
  return report;
}

nlohmann::json StepsReport::to_json() const {
  nlohmann::json config = bench.to_json();
  config.erase("densities");
  config["steps"] = steps.steps;
  config["layers"] = steps.layers;
  config["sparse_attn"] = nlohmann::json::parse(steps.sparse.to_json());
  nlohmann::json rows = nlohmann::json::array();
  for (const StepResult& r : results)
    rows.push_back({{"step", r.step},
                    {"backend", r.backend},
                    {"dense_layers", r.dense_layers},
                    {"density", r.density},
                    {"ms", r.ms},
                    {"estimate_ms", r.estimate_ms},
                    {"rel_err_vs_dense", r.rel_err_vs_dense}});
  return {{"config", config},
          {"backend", backend},
          {"backend_origin", origin},
          {"resolution", source},
          {"plan_cache", {{"hits", plan_cache_hits}, {"misses", plan_cache_misses}}},
          {"results", rows}};
}

std::string StepsReport::to_table() const {
  const BenchConfig& c = bench;
  std::ostringstream os;
  os << "tessel bench --steps " << steps.steps << ": " << c.device.str() << " " << dtype_name(c.dtype) << " B=" << c.batch
     << " H=" << c.heads << "/" << c.effective_kv_heads() << " D=" << c.head_dim << " S_q=" << c.seq
     << " S_kv=" << c.effective_seq_kv() << ", " << steps.layers << " layer(s), median of " << c.iters << " runs\n"
     << "backend: " << backend << (origin.empty() ? "" : " [" + origin + "]") << " (resolved by " << source
     << "), pattern " << pattern_type_name(steps.sparse.pattern.type) << ", schedule " << steps.sparse.schedule << "\n";
  char line[256];
  std::snprintf(line, sizeof line, "%5s %-16s %6s %8s %11s %12s %14s\n", "step", "backend", "dense", "density", "ms",
                "estimate_ms", "err_vs_dense");
  os << line;
  for (const StepResult& r : results) {
    std::snprintf(line, sizeof line, "%5lld %-16s %6lld %8.4f %11.3f %12.3f %14.2e\n", static_cast<long long>(r.step),
                  r.backend.c_str(), static_cast<long long>(r.dense_layers), r.density, r.ms, r.estimate_ms,
                  r.rel_err_vs_dense);
    os << line;
  }
  os << "plan cache: " << plan_cache_misses << " plan(s), " << plan_cache_hits << " hit(s)\n";
  return os.str();
}

}  // namespace tessel::cli
