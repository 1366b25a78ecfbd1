#include "tessel/sparse/estimators/topk_estimator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "head_data.h"
#include "tessel/sparse/estimators/block_scoring.h"
#include "tessel/core/error.h"
#include "tessel/core/parallel.h"

namespace tessel {
namespace {

struct PooledBlocks {
  std::vector<float> mean;     // (blocks, D)
  std::vector<uint8_t> similar;
};

// Step 0: rows[t] -= mean over t of rows[t], for a (seq, D) matrix (the mean accumulated in double).
void subtract_sequence_mean(std::vector<float>& rows, int64_t seq, int64_t dim) {
  std::vector<double> mean(static_cast<size_t>(dim), 0.0);
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t d = 0; d < dim; ++d) mean[d] += rows[t * dim + d];
  for (int64_t d = 0; d < dim; ++d) mean[d] /= static_cast<double>(seq);
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t d = 0; d < dim; ++d) rows[t * dim + d] -= static_cast<float>(mean[d]);
}

// Mean vector and self-similarity of each block of `block` rows of a (seq, D) matrix. With
// whole_blocks_only (rule kSpargeAttn) a partial block or one with a zero-norm token is not
// self-similar.
PooledBlocks pool_blocks(const std::vector<float>& rows, int64_t seq, int64_t dim, int64_t block, double threshold,
                         bool whole_blocks_only) {
  const int64_t blocks = (seq + block - 1) / block;
  PooledBlocks out{std::vector<float>(static_cast<size_t>(blocks * dim), 0.0f), std::vector<uint8_t>(blocks, 0)};
  std::vector<float> unit_sum(static_cast<size_t>(dim));
  for (int64_t c = 0; c < blocks; ++c) {
    const int64_t lo = c * block, hi = std::min(seq, lo + block), n = hi - lo;
    float* mean = out.mean.data() + c * dim;
    std::fill(unit_sum.begin(), unit_sum.end(), 0.0f);
    bool has_zero_token = false;
    for (int64_t t = lo; t < hi; ++t) {
      const float* x = rows.data() + t * dim;
      const float norm = std::sqrt(block_scoring::dot(x, x, dim));
      has_zero_token = has_zero_token || norm == 0.0f;
      const float inv = norm > 0.0f ? 1.0f / norm : 0.0f;
      for (int64_t d = 0; d < dim; ++d) {
        mean[d] += x[d];
        unit_sum[d] += x[d] * inv;
      }
    }
    for (int64_t d = 0; d < dim; ++d) mean[d] /= static_cast<float>(n);
    const float sim = block_scoring::dot(unit_sum.data(), unit_sum.data(), dim) / static_cast<float>(n * n);
    const bool judged = !whole_blocks_only || (n == block && !has_zero_token);
    out.similar[c] = judged && static_cast<double>(sim) > threshold ? 1 : 0;
  }
  return out;
}

void check_options(const TopkEstimatorOptions& o) {
  if (o.block_q < 1) fail_argument("topk.block_q", ">= 1", o.block_q);
  if (o.block_kv < 1) fail_argument("topk.block_kv", ">= 1", o.block_kv);
  if (o.cdf_threshold > 1.0 || std::isnan(o.cdf_threshold)) fail_argument("topk.cdf_threshold", "<= 1 (<= 0 for top-k mode)", o.cdf_threshold);
  if (o.cdf_threshold <= 0.0 && !(o.topk_ratio > 0.0 && o.topk_ratio <= 1.0)) fail_argument("topk.topk_ratio", "in (0, 1]", o.topk_ratio);
  for (size_t h = 0; h < o.per_head.size(); ++h)
    if (!(o.per_head[h] > 0.0 && o.per_head[h] <= 1.0)) fail_argument(detail::concat("topk.per_head[", h, "]"), "in (0, 1]", o.per_head[h]);
  if (o.keep.sink_blocks < 0) fail_argument("topk.keep.sink_blocks", ">= 0", o.keep.sink_blocks);
}

}  // namespace

int64_t topk_count(TopkRule rule, double ratio, int64_t kv_blocks) {
  if (rule == TopkRule::kSpargeAttn) {
    // fp32 product truncated toward zero, as SpargeAttn's (topk * K).to(torch.int64) on an fp32 tensor.
    const auto n = static_cast<int64_t>(static_cast<float>(ratio) * static_cast<float>(kv_blocks));
    return std::clamp<int64_t>(n, 1, kv_blocks);
  }
  return std::clamp<int64_t>(std::llround(ratio * static_cast<double>(kv_blocks)), 1, kv_blocks);
}

EstimateResult estimate_topk_mask(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TopkEstimatorOptions& options) {
  estimators::check_qk(q, k, "estimate_topk_mask");
  check_options(options);
  if (!options.per_head.empty() && static_cast<int64_t>(options.per_head.size()) != q.size(2))
    fail_argument("topk.per_head", detail::concat(q.size(2), " values (one per query head)"), options.per_head.size());
  const auto start = std::chrono::steady_clock::now();
  const int64_t batch = q.size(0), seq_q = q.size(1), hq = q.size(2), dim = q.size(3);
  const int64_t seq_kv = k.size(1), hkv = k.size(2), group = hq / hkv;
  const BlockMaskShape shape{batch, hq, seq_q, seq_kv, options.block_q, options.block_kv};
  const int64_t qbs = shape.q_blocks(), kvbs = shape.kv_blocks();
  const float scale = options.scale != 0.0f ? options.scale : 1.0f / std::sqrt(static_cast<float>(dim));

  const bool spargeattn = options.rule == TopkRule::kSpargeAttn;
  std::vector<PooledBlocks> pooled_k(static_cast<size_t>(batch * hkv));
  parallel_for(ctx.threads(), batch * hkv, [&](int64_t i, int) {
    std::vector<float> rows = estimators::head_rows(k, i / hkv, i % hkv, seq_kv);
    if (options.smooth_k) subtract_sequence_mean(rows, seq_kv, dim);
    pooled_k[i] = pool_blocks(rows, seq_kv, dim, options.block_kv, options.similarity_threshold, spargeattn);
  });

  std::vector<uint8_t> dense(static_cast<size_t>(batch * hq * qbs * kvbs), 0);
  parallel_for(ctx.threads(), batch * hq, [&](int64_t bh, int) {
    const int64_t b = bh / hq, h = bh % hq;
    const PooledBlocks pq =
        pool_blocks(estimators::head_rows(q, b, h, seq_q), seq_q, dim, options.block_q, options.similarity_threshold, spargeattn);
    const PooledBlocks& pk = pooled_k[b * hkv + h / group];
    const bool cdf_mode = options.cdf_threshold > 0.0;
    const double value = options.per_head.empty() ? (cdf_mode ? options.cdf_threshold : options.topk_ratio) : options.per_head[h];
    const int64_t n_topk = topk_count(options.rule, value, kvbs);
    std::vector<int32_t> candidates;
    for (int64_t c = 0; c < kvbs; ++c)
      if (pk.similar[c]) candidates.push_back(static_cast<int32_t>(c));
    std::vector<float> prob(static_cast<size_t>(kvbs));
    for (int64_t r = 0; r < qbs; ++r) {
      uint8_t* row = dense.data() + (bh * qbs + r) * kvbs;
      if (!pq.similar[r]) {
        std::fill(row, row + kvbs, uint8_t{1});
        continue;
      }
      for (int64_t c = 0; c < kvbs; ++c)
        if (!pk.similar[c]) row[c] = 1;
      if (candidates.empty()) continue;
      // The other blocks of the row are exactly the candidates: the rule chooses among them.
      block_scoring::pooled_softmax_scores(pq.mean.data() + r * dim, pk.mean.data(), candidates, dim, scale, prob.data());
      if (cdf_mode && spargeattn) block_scoring::keep_while_cdf_at_most(prob.data(), kvbs, value, row);
      else if (cdf_mode) block_scoring::keep_until_cdf(prob.data(), kvbs, value, row);
      else block_scoring::keep_top_k(prob.data(), kvbs, n_topk, row);
    }
  });
  AlwaysKeep keep = options.keep;
  keep.text = false;
  apply_always_keep(shape, keep, nullptr, dense);
  EstimateResult result{BlockMask::from_dense(shape, dense), 0.0};
  result.estimate_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace tessel
