// `tessel bench-estimate`: time of the device mask estimators against dense attention on the same
// shape (the budget is a few percent of it). dynamic_topk is timed in its worst case, every block
// self-similar so every row is scored, sorted and cut; the threshold (XAttention) estimator costs
// the same on any data.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>
#include <memory>
#include <string>

#include "bench_timer.h"
#include "command.h"
#include "option_checks.h"
#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "tessel/core/tensor.h"
#include "tessel/kernels/attention.h"
#include "tessel/sparse/estimators/device_mask_estimation.h"

namespace tessel::cli {
namespace {

struct EstimateBenchConfig {
  int64_t heads = 40, kv_heads = 0, head_dim = 128, seq = 29700;
  double topk_ratio = 0.3, cdf_threshold = 0.0, threshold = 0.95;
  std::vector<int64_t> strides{8, 16};  // XAttention antidiagonal strides to time
  int iters = 10, warmup = 3;
  bool smooth_k = true;  // off: the estimate without the K-mean pass (SpargeAttn's smooth_k=False path)
  std::string rule = "spargeattn";  // dynamic_topk rule: spargeattn or reach-target
  std::string padding = "chunk";    // XAttention keys: chunk (zero-padded, the official rule) or none
};

double median_ms(const ExecContext& ctx, int warmup, int iters, const std::function<void()>& run) {
  for (int i = 0; i < warmup; ++i) run();
  auto timer = make_bench_timer(ctx);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    timer->start();
    run();
    ms.push_back(timer->stop_ms());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int run(const EstimateBenchConfig& c) {
  if (c.kv_heads > 0) require_multiple("--heads", c.heads, "--kv-heads", c.kv_heads);
  if (!cuda_available()) throw Error("bench-estimate: needs a CUDA GPU (none visible, or tessel built without CUDA)");
  const Device gpu = Device::cuda();
  ExecContext ctx;
  ctx.device = gpu;
  const int64_t hk = c.kv_heads > 0 ? c.kv_heads : c.heads;
  Tensor host = Tensor::empty({1, c.seq, c.heads, c.head_dim}, DType::kBF16);
  fill_normal(host.view(), 1);
  const Tensor q = host.to(gpu);
  Tensor host_k = Tensor::empty({1, c.seq, hk, c.head_dim}, DType::kBF16);
  fill_normal(host_k.view(), 2);
  const Tensor k = host_k.to(gpu), v = host_k.to(gpu);
  Tensor out = Tensor::empty({1, c.seq, c.heads, c.head_dim}, DType::kBF16, gpu);

  const double dense_ms = median_ms(ctx, c.warmup, c.iters, [&] { attention_forward(ctx, q, k, v, out, {}); });
  TopkEstimatorOptions options;
  options.topk_ratio = c.topk_ratio;
  options.cdf_threshold = c.cdf_threshold;
  options.similarity_threshold = -1.0;  // worst case: every row scored and sorted
  options.smooth_k = c.smooth_k;
  options.rule = c.rule == "reach-target" ? TopkRule::kReachTarget : TopkRule::kSpargeAttn;
  options.keep.diagonal = true;
  DeviceEstimatedMask mask({1, c.heads, c.seq, c.seq, options.block_q, options.block_kv}, hk, c.head_dim, gpu);
  const double topk_ms = median_ms(ctx, c.warmup, c.iters, [&] { estimate_topk_mask_device(ctx, q, k, options, mask); });
  const double density = mask.to_host().density();
  struct ThresholdRow {
    int64_t stride;
    double ms, density;
  };
  std::vector<ThresholdRow> threshold_rows;
  for (const int64_t stride : c.strides) {
    XAttentionOptions xattention;
    xattention.threshold = c.threshold;
    xattention.stride = stride;
    xattention.padding = c.padding == "none" ? XAttentionPadding::kNone : XAttentionPadding::kChunk;
    DeviceEstimatedMask threshold_mask({1, c.heads, c.seq, c.seq, xattention.block_q, xattention.block_kv}, hk,
                                       c.head_dim, gpu, stride);
    const double ms =
        median_ms(ctx, c.warmup, c.iters, [&] { estimate_xattention_mask_device(ctx, q, k, xattention, threshold_mask); });
    threshold_rows.push_back({stride, ms, threshold_mask.to_host().density()});
  }
  const double sparse_ms =
      median_ms(ctx, c.warmup, c.iters, [&] { block_sparse_attention_forward(ctx, q, k, v, mask.view(), out, {}); });
  std::printf("bench-estimate: cuda bf16 B=1 H=%lld/%lld D=%lld S=%lld, median of %d runs\n",
              static_cast<long long>(c.heads), static_cast<long long>(hk), static_cast<long long>(c.head_dim),
              static_cast<long long>(c.seq), c.iters);
  std::printf("%-22s %10s %12s\n", "what", "ms", "% of dense");
  std::printf("%-22s %10.3f %12.2f\n", "dense attention", dense_ms, 100.0);
  std::printf("%-22s %10.3f %12.2f\n", "dynamic_topk estimate", topk_ms, 100.0 * topk_ms / dense_ms);
  std::printf("%-22s %10.3f %12.2f   (density %.3f)\n", "sparse attention", sparse_ms, 100.0 * sparse_ms / dense_ms,
              density);
  for (const ThresholdRow& row : threshold_rows)
    std::printf("%-22s %10.3f %12.2f   (stride %lld, threshold %.2f, density %.3f)\n", "threshold estimate", row.ms,
                100.0 * row.ms / dense_ms, static_cast<long long>(row.stride), c.threshold, row.density);
  return 0;
}

CommandRegistration registration{
    "bench-estimate", "Time the device mask estimators against dense attention (CUDA)", [](CLI::App& app) {
      auto c = std::make_shared<EstimateBenchConfig>();
      const CLI::Validator ratio = number_in(0.0, 1.0, Bounds::kOpenLow);
      app.add_option("--heads", c->heads, "query heads")->capture_default_str()->check(integer_in(1, kMaxHeads));
      app.add_option("--kv-heads", c->kv_heads, "key/value heads (default: --heads)")->check(integer_in(1, kMaxHeads));
      app.add_option("--head-dim", c->head_dim, "head dimension")->capture_default_str()->check(integer_in(1, kMaxHeadDim));
      app.add_option("--seq", c->seq, "tokens")->capture_default_str()->check(integer_in(1, kMaxTokens));
      app.add_option("--topk-ratio", c->topk_ratio, "dynamic_topk kept fraction in (0, 1]")->capture_default_str()->check(ratio);
      app.add_option("--cdf", c->cdf_threshold, "dynamic_topk cdf threshold in (0, 1] (selects cdf mode)")->check(ratio);
      app.add_option("--threshold", c->threshold, "XAttention mass threshold in (0, 1]")->capture_default_str()->check(ratio);
      app.add_option("--strides", c->strides, "XAttention strides to time (comma separated)")
          ->delimiter(',')
          ->capture_default_str()
          ->check(integer_in(2, 64));
      app.add_flag("!--no-smooth-k", c->smooth_k,
                   "dynamic_topk without subtracting K's mean first (the estimate as it was before K smoothing)");
      app.add_option("--rule", c->rule,
                     "dynamic_topk rule: spargeattn (SpargeAttn's count and cdf cut) or reach-target (the rule before "
                     "the parity work)")
          ->capture_default_str()
          ->check(CLI::IsMember({"spargeattn", "reach-target"}));
      app.add_option("--xattention-padding", c->padding,
                     "threshold estimate keys: chunk (zero-padded to the official chunk) or none (the real keys "
                     "only, the estimate before the parity work)")
          ->capture_default_str()
          ->check(CLI::IsMember({"chunk", "none"}));
      app.add_option("--warmup", c->warmup, "untimed runs before each measurement")
          ->capture_default_str()
          ->check(integer_in(0, kMaxRepeats));
      app.add_option("--iters", c->iters, "timed runs (the median is reported)")->capture_default_str()->check(integer_in(1, kMaxRepeats));
      return CommandRunner([c] { return run(*c); });
    }};

}  // namespace
}  // namespace tessel::cli
