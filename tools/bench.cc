#include "bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iomanip>
#include <optional>
#include <sstream>

#include "bench_mask_export.h"
#include "bench_timer.h"
#include "option_checks.h"
#include "tessel/core/error.h"
#include "tessel/core/parallel.h"
#include "tessel/core/random.h"
#include "tessel/core/tensor.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/attention_tuning.h"
#include "tessel/kernels/reference.h"
#include "tessel/sparse/block_mask.h"

namespace tessel::cli {
namespace {

struct Inputs {
  Tensor q_host, k_host, v_host;  // CPU copies, read by the reference
  Tensor q, k, v, out, lse;       // on the bench device
};

Inputs make_inputs(const BenchConfig& c) {
  const int64_t hk = c.effective_kv_heads(), skv = c.effective_seq_kv();
  Inputs in;
  in.q_host = Tensor::empty({c.batch, c.seq, c.heads, c.head_dim}, c.dtype);
  in.k_host = Tensor::empty({c.batch, skv, hk, c.head_dim}, c.dtype);
  in.v_host = Tensor::empty({c.batch, skv, hk, c.head_dim}, c.dtype);
  fill_normal(in.q_host.view(), c.seed * 3 + 1);
  fill_normal(in.k_host.view(), c.seed * 3 + 2);
  fill_normal(in.v_host.view(), c.seed * 3 + 3);
  in.q = in.q_host.to(c.device);
  in.k = in.k_host.to(c.device);
  in.v = in.v_host.to(c.device);
  in.out = Tensor::empty(in.q_host.shape(), c.dtype, c.device);
  in.lse = Tensor::empty({c.batch, c.heads, c.seq}, DType::kF32, c.device);
  return in;
}

// Fraction of all (query, key) pairs a kernel computes: the kept blocks, further cut by causality.
double computed_fraction(const BenchConfig& c, const BlockMask* mask) {
  const int64_t seq_kv = c.effective_seq_kv(), shift = seq_kv - c.seq;
  if (!c.causal) return mask ? mask->token_density() : 1.0;
  auto visible_in = [&](int64_t i, int64_t begin, int64_t end) {  // keys in [begin, end) visible to query i
    return std::max<int64_t>(0, std::min(end, i + shift + 1) - begin);
  };
  double pairs = 0.0;
  if (!mask) {
    for (int64_t i = 0; i < c.seq; ++i) pairs += static_cast<double>(visible_in(i, 0, seq_kv));
    return pairs / (static_cast<double>(c.seq) * static_cast<double>(seq_kv));
  }
  const BlockMaskShape& s = mask->shape();
  for (int64_t r = 0; r < s.num_rows(); ++r) {
    const int64_t qb = r % s.q_blocks();
    for (int32_t n = mask->indptr()[static_cast<size_t>(r)]; n < mask->indptr()[static_cast<size_t>(r + 1)]; ++n) {
      const int64_t j0 = mask->indices()[static_cast<size_t>(n)] * s.block_kv, j1 = std::min(seq_kv, j0 + s.block_kv);
      for (int64_t i = qb * s.block_q; i < std::min(c.seq, (qb + 1) * s.block_q); ++i)
        pairs += static_cast<double>(visible_in(i, j0, j1));
    }
  }
  return pairs / (static_cast<double>(s.mask_batch * s.mask_heads) * static_cast<double>(c.seq) *
                  static_cast<double>(seq_kv));
}


// Median ms of each run function. Iterations go round-robin over the methods, so on a shared
// machine a burst of load slows every method alike instead of one of them.
std::vector<double> time_medians_ms(const BenchConfig& c, const ExecContext& ctx,
                                    const std::vector<std::function<void()>>& runs) {
  for (const auto& run : runs)
    for (int i = 0; i < c.warmup; ++i) run();
  auto timer = make_bench_timer(ctx);
  std::vector<std::vector<double>> ms(runs.size());
  for (int i = 0; i < c.iters; ++i)
    for (size_t m = 0; m < runs.size(); ++m) {
      timer->start();
      runs[m]();
      ms[m].push_back(timer->stop_ms());
    }
  std::vector<double> medians;
  for (auto& v : ms) medians.push_back(median(v));
  return medians;
}


// The variant names --kernel-variants may list: the 16-bit ones, and with --fp8 the FP8 mode's.
std::vector<std::string> offered_variants(const BenchConfig& c) {
  std::vector<std::string> names = attention_kernel_variants(c.device, c.head_dim);
  if (c.fp8)
    for (const std::string& n : attention_kernel_variants(c.device, c.head_dim, AttentionPrecision::kFp8)) names.push_back(n);
  return names;
}

void validate(const BenchConfig& c) {
  if (c.batch < 1) fail_argument("--batch", ">= 1", c.batch);
  if (c.heads < 1) fail_argument("--heads", ">= 1", c.heads);
  if (c.kv_heads < 0 || c.heads % c.effective_kv_heads() != 0)
    fail_argument("--kv-heads", detail::concat("a divisor of --heads ", c.heads), c.kv_heads);
  if (c.head_dim < 1) fail_argument("--head-dim", ">= 1", c.head_dim);
  if (c.seq < 1) fail_argument("--seq", ">= 1", c.seq);
  if (c.seq_kv < 0) fail_argument("--seq-kv", ">= 1 (0 = --seq)", c.seq_kv);
  if (c.iters < 1) fail_argument("--iters", ">= 1", c.iters);
  if (c.warmup < 0) fail_argument("--warmup", ">= 0", c.warmup);
  if (c.densities.empty()) fail_argument("--density", "at least one value", "none");
  for (double d : c.densities)
    if (!(d > 0.0 && d <= 1.0)) fail_argument("--density", "values in (0, 1]", d);
  present_device(c.device, "--device");
  if (c.fp8 && !c.device.is_cuda()) fail_argument("--fp8", "--device cuda (FP8 attention runs on CUDA)", c.device.str());
  if ((c.tune || !c.kernel_variants.empty()) && !c.device.is_cuda())
    fail_argument(c.tune ? "--tune" : "--kernel-variants", "--device cuda (the CPU has no kernel variants)", c.device.str());
  if (!c.kernel_variants.empty()) {
    const std::vector<std::string> offered = offered_variants(c);
    std::string names;
    for (const std::string& n : offered) names += (names.empty() ? "" : ", ") + n;
    for (const std::string& v : c.kernel_variants)
      if (v != "all" && std::find(offered.begin(), offered.end(), v) == offered.end())
        fail_argument("--kernel-variants",
                      offered.empty() ? "none: this device has no kernel variants for this head dim" : "all or some of " + names, v);
  }
}

std::vector<std::string> expanded_variants(const BenchConfig& c) {
  std::vector<std::string> out;
  for (const std::string& v : c.kernel_variants)
    for (const std::string& name : v == "all" ? offered_variants(c) : std::vector<std::string>{v})
      if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  return out;
}

std::string tuning_note(const char* what, const AttentionTuning& t) {
  std::ostringstream os;
  os << "tuning " << what << ": " << (t.chosen.empty() ? std::string("no variants on this device") : "runs " + t.chosen);
  if (t.cached) os << " (chosen before)";
  for (size_t i = 0; i < t.median_ms.size(); ++i)
    os << (i == 0 ? " — " : ", ") << t.median_ms[i].first << " " << std::fixed << std::setprecision(3) << t.median_ms[i].second
       << " ms";
  return os.str();
}

}  // namespace

nlohmann::json BenchConfig::to_json() const {
  return {{"device", device.str()},     {"dtype", std::string(dtype_name(dtype))},
          {"batch", batch},             {"heads", heads},
          {"kv_heads", effective_kv_heads()}, {"head_dim", head_dim},
          {"seq", seq},                 {"seq_kv", effective_seq_kv()},
          {"densities", densities},     {"block_q", block_q},
          {"block_kv", block_kv},       {"iters", iters},
          {"warmup", warmup},           {"threads", device.is_cpu() ? max_threads() : 0},
          {"causal", causal},           {"fp8", fp8},
          {"seed", seed}};
}

nlohmann::json BenchReport::to_json() const {
  nlohmann::json results_json = nlohmann::json::array();
  for (const BenchResult& r : results)
    results_json.push_back({{"method", r.method},
                            {"density", r.density},
                            {"ms", r.ms},
                            {"tflops_dense_equiv", r.tflops_dense_equiv},
                            {"tflops_effective", r.tflops_effective},
                            {"max_rel_err", r.max_rel_err}});
  return {{"config", config.to_json()}, {"results", results_json}, {"notes", notes}};
}

std::string BenchReport::to_table() const {
  const BenchConfig& c = config;
  std::ostringstream os;
  os << "tessel bench: " << c.device.str() << " " << dtype_name(c.dtype) << " B=" << c.batch << " H=" << c.heads << "/"
     << c.effective_kv_heads() << " D=" << c.head_dim << " S_q=" << c.seq << " S_kv=" << c.effective_seq_kv()
     << " blocks " << c.block_q << "x" << c.block_kv << (c.causal ? " causal" : "") << ", median of " << c.iters
     << " runs";
  if (c.device.is_cpu()) os << ", " << max_threads() << " threads";
  os << "\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-28s %8s %11s %14s %14s %12s\n", "method", "density", "ms", "TFLOP/s dense",
                "TFLOP/s eff", "max_rel_err");
  os << line;
  for (const BenchResult& r : results) {
    std::snprintf(line, sizeof line, "%-28s %8.4f %11.3f %14.4f %14.4f %12.2e\n", r.method.c_str(), r.density, r.ms,
                  r.tflops_dense_equiv, r.tflops_effective, r.max_rel_err);
    os << line;
  }
  for (const std::string& note : notes) os << note << "\n";
  return os.str();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double sampled_relative_error(const BenchConfig& c, const Tensor& q_host, const Tensor& k_host, const Tensor& v_host,
                              const BlockMask* mask, const AttentionOptions& opt, const Tensor& out_any_device) {
  std::vector<int64_t> rows;
  const int64_t n = std::min(c.check_rows, c.seq);
  for (int64_t r = 0; r < n; ++r) rows.push_back(n == 1 ? 0 : r * (c.seq - 1) / (n - 1));
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  const auto ref = mask ? reference::block_sparse_attention(q_host, k_host, v_host, mask->view(), opt, rows)
                        : reference::attention(q_host, k_host, v_host, opt, rows);
  const Tensor out = out_any_device.to(Device::cpu());
  double max_err = 0.0, max_ref = 0.0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t r = 0; r < ref.rows(); ++r)
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t d = 0; d < c.head_dim; ++d) {
          const int64_t i = ref.q_rows[static_cast<size_t>(r)];
          const double want = ref.out_at(b, r, h, d);
          const double got = element_as_double(out.view(), ((b * c.seq + i) * c.heads + h) * c.head_dim + d);
          max_err = std::max(max_err, std::isfinite(got) ? std::abs(got - want) : INFINITY);
          max_ref = std::max(max_ref, std::abs(want));
        }
  return max_ref > 0.0 ? max_err / max_ref : max_err;
}

BenchReport run_bench(const BenchConfig& config) {
  validate(config);
  if (config.threads > 0) set_num_threads(config.threads);
  ExecContext ctx;
  ctx.device = config.device;
  ctx.num_threads = config.threads;
  // Scratch sized once, as a plan would: the timed calls allocate nothing.
  Workspace workspace(config.device);
  const AttentionDims dims{config.batch, config.seq, config.effective_seq_kv(), config.heads,
                           config.effective_kv_heads(), config.head_dim,
                           config.fp8 ? AttentionPrecision::kFp8 : AttentionPrecision::kInput};
  workspace.reserve(attention_workspace_bytes(ctx, config.device, dims, config.block_kv));
  ctx.workspace = &workspace;
  Inputs in = make_inputs(config);
  AttentionOptions opt;
  opt.causal = config.causal;
  AttentionOptions fp8_opt = opt;
  fp8_opt.precision = AttentionPrecision::kFp8;
  const double flops = 4.0 * static_cast<double>(config.batch * config.heads) * static_cast<double>(config.seq) *
                       static_cast<double>(config.effective_seq_kv()) * static_cast<double>(config.head_dim);
  // One method per density (and its FP8 twin with --fp8): the masks (host and device copies) live
  // until every run is timed.
  struct Method {
    BenchResult result;
    std::optional<BlockMask> mask;
    std::optional<BlockMask::DeviceCopy> device_mask;
  };
  std::vector<Method> methods(config.densities.size());
  methods.reserve(2 * config.densities.size());  // the FP8 twins never move the masks the runs read
  std::vector<std::function<void()>> runs;
  for (size_t n = 0; n < config.densities.size(); ++n) {
    Method& m = methods[n];
    if (config.densities[n] >= 1.0) {
      m.result.method = "dense";
      runs.push_back([&ctx, &in, &opt] { attention_forward(ctx, in.q, in.k, in.v, in.out, in.lse, opt); });
    } else {
      // One mask per (batch, query head): the general case a kernel must handle.
      m.mask = BlockMask::random({config.batch, config.heads, config.seq, config.effective_seq_kv(), config.block_q,
                                  config.block_kv},
                                 config.densities[n], config.seed + 1000 * (n + 1));
      m.device_mask = m.mask->to_device(config.device);
      m.result.method = "block_sparse";
      const BlockMaskView view = m.device_mask->view();
      runs.push_back(
          [&ctx, &in, &opt, view] { block_sparse_attention_forward(ctx, in.q, in.k, in.v, view, in.out, in.lse, opt); });
    }
    m.result.density = m.mask ? m.mask->density() : 1.0;
    if (!config.save_mask_dir.empty()) save_bench_mask(config, config.densities[n], m.mask ? &*m.mask : nullptr);
  }
  if (config.fp8) {
    // The same calls in FP8, on the same masks (the device copies stay with the methods above).
    const size_t plain_methods = methods.size();
    for (size_t n = 0; n < plain_methods; ++n) {
      Method twin;
      twin.result.method = methods[n].result.method + "_fp8";
      twin.result.density = methods[n].result.density;
      if (methods[n].device_mask) {
        const BlockMaskView view = methods[n].device_mask->view();
        runs.push_back([&ctx, &in, &fp8_opt, view] {
          block_sparse_attention_forward(ctx, in.q, in.k, in.v, view, in.out, in.lse, fp8_opt);
        });
      } else {
        runs.push_back([&ctx, &in, &fp8_opt] { attention_forward(ctx, in.q, in.k, in.v, in.out, in.lse, fp8_opt); });
      }
      methods.push_back(std::move(twin));
    }
  }
  BenchReport report{config, {}, {}};
  const size_t plain_methods = config.densities.size();
  // Which plain method (and so which mask) each run belongs to: an FP8 twin's or a variant's is
  // its plain method's.
  std::vector<size_t> plain_of(methods.size());
  for (size_t n = 0; n < methods.size(); ++n) plain_of[n] = n % plain_methods;
  if (config.tune) {
    const bool any_dense = std::any_of(config.densities.begin(), config.densities.end(), [](double d) { return d >= 1.0; });
    double sparse_sum = 0.0;
    int sparse_count = 0;
    for (double d : config.densities)
      if (d < 1.0) sparse_sum += d, ++sparse_count;
    const AttentionDims plain_dims{dims.batch, dims.seq_q, dims.seq_kv, dims.heads, dims.kv_heads, dims.head_dim};
    if (any_dense)
      report.notes.push_back(
          tuning_note("dense", tune_attention(ctx, config.device, config.dtype, plain_dims, {false, 1.0, config.causal})));
    if (sparse_count > 0)
      report.notes.push_back(tuning_note(
          "block-sparse", tune_attention(ctx, config.device, config.dtype, plain_dims,
                                         {true, sparse_sum / sparse_count, config.causal})));
  }
  const std::vector<std::string> variants = expanded_variants(config);
  const std::vector<std::string> fp8_variants =
      config.fp8 ? attention_kernel_variants(config.device, config.head_dim, AttentionPrecision::kFp8)
                 : std::vector<std::string>{};
  auto lift_forced_variants = [&] {
    force_attention_kernel_variant(config.device, config.head_dim, "");
    if (config.fp8) force_attention_kernel_variant(config.device, config.head_dim, "", AttentionPrecision::kFp8);
  };
  if (!variants.empty()) {
    // Every method once per variant of its precision (the 16-bit variants for the plain methods,
    // the FP8 ones for their FP8 twins), the variant forced around each call (interleaved rounds,
    // so the variants see the same clocks); they replace the plain runs.
    std::vector<Method> variant_methods;
    std::vector<std::function<void()>> variant_runs;
    std::vector<size_t> variant_plain_of;
    const Device device = config.device;
    const int64_t head_dim = config.head_dim;
    for (const std::string& v : variants) {
      const bool fp8_variant = std::find(fp8_variants.begin(), fp8_variants.end(), v) != fp8_variants.end();
      const AttentionPrecision precision = fp8_variant ? AttentionPrecision::kFp8 : AttentionPrecision::kInput;
      for (size_t n = 0; n < runs.size(); ++n) {
        if ((n >= plain_methods) != fp8_variant) continue;  // runs past the plain methods are the FP8 twins
        Method m;
        m.result = methods[n].result;
        m.result.method += "@" + v;
        variant_methods.push_back(std::move(m));
        variant_runs.push_back([device, head_dim, v, precision, run = runs[n]] {
          force_attention_kernel_variant(device, head_dim, v, precision);
          run();
        });
        variant_plain_of.push_back(n % plain_methods);
      }
    }
    for (size_t n = 0; n < plain_methods; ++n) {  // the masks stay with the plain methods
      variant_methods.push_back(std::move(methods[n]));
      variant_methods.back().result.method.clear();
    }
    methods = std::move(variant_methods);
    runs = std::move(variant_runs);
    plain_of = std::move(variant_plain_of);
  }
  std::vector<double> ms;
  try {
    ms = time_medians_ms(config, ctx, runs);
  } catch (...) {
    if (!variants.empty()) lift_forced_variants();
    throw;
  }
  const size_t mask_base = variants.empty() ? 0 : runs.size();  // where the plain methods (and masks) are
  for (size_t n = 0; n < runs.size(); ++n) {
    Method& m = methods[n];
    const Method& plain = methods[mask_base + plain_of[n]];
    const BlockMask* mask = plain.mask ? &*plain.mask : nullptr;
    m.result.ms = ms[n];
    const double seconds = m.result.ms * 1e-3;
    m.result.tflops_dense_equiv = flops / seconds * 1e-12;
    m.result.tflops_effective = flops * computed_fraction(config, mask) / seconds * 1e-12;
    runs[n]();  // the output of this method, for the error check
    m.result.max_rel_err = sampled_relative_error(config, in.q_host, in.k_host, in.v_host, mask, opt, in.out);
    report.results.push_back(m.result);
  }
  if (!variants.empty()) lift_forced_variants();
  return report;
}

}  // namespace tessel::cli
