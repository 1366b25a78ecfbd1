#include "tessel/sparse/estimators/xattention_estimator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "head_data.h"
#include "tessel/core/error.h"
#include "tessel/core/parallel.h"
#include "tessel/sparse/planners/always_keep.h"

namespace tessel {
namespace {

void check_options(const XAttentionOptions& o) {
  if (o.stride != 8 && o.stride != 16) fail_argument("xattention.stride", "8 or 16", o.stride);
  if (o.block_q < o.stride || o.block_q % o.stride != 0)
    fail_argument("xattention.block_q", detail::concat("a multiple of the stride ", o.stride), o.block_q);
  if (o.block_kv < o.stride || o.block_kv % o.stride != 0)
    fail_argument("xattention.block_kv", detail::concat("a multiple of the stride ", o.stride), o.block_kv);
  if (!(o.threshold > 0.0 && o.threshold <= 1.0)) fail_argument("xattention.threshold", "in (0, 1]", o.threshold);
  for (size_t h = 0; h < o.per_head_threshold.size(); ++h)
    if (!(o.per_head_threshold[h] > 0.0 && o.per_head_threshold[h] <= 1.0))
      fail_argument(detail::concat("xattention.per_head_threshold[", h, "]"), "in (0, 1]", o.per_head_threshold[h]);
}

// Steps 1–4 of the header for every (b, h_q): masses (B, H_q, Qb, KVb).
std::vector<float> block_mass(int threads, const TensorView& q, const TensorView& k, const XAttentionOptions& o) {
  const int64_t batch = q.size(0), seq_q = q.size(1), hq = q.size(2), dim = q.size(3);
  const int64_t seq_kv = k.size(1), hkv = k.size(2), group = hq / hkv, s = o.stride;
  const int64_t gq = (seq_q + s - 1) / s, gk = (seq_kv + s - 1) / s;
  const BlockMaskShape shape{batch, hq, seq_q, seq_kv, o.block_q, o.block_kv};
  const int64_t qbs = shape.q_blocks(), kvbs = shape.kv_blocks();
  const int64_t groups_per_qb = o.block_q / s, groups_per_kvb = o.block_kv / s;
  const float scale = (o.scale != 0.0f ? o.scale : 1.0f / std::sqrt(static_cast<float>(dim))) / static_cast<float>(s);

  // Key groups are contiguous rows: group g' is the (S·D) vector k[g'S .. g'S+S).
  std::vector<std::vector<float>> keys(static_cast<size_t>(batch * hkv));
  parallel_for(threads, batch * hkv, [&](int64_t i, int) { keys[i] = estimators::head_rows(k, i / hkv, i % hkv, gk * s); });
  std::vector<std::vector<float>> queries(static_cast<size_t>(batch * hq));
  parallel_for(threads, batch * hq, [&](int64_t i, int) {
    // Reverse each group's tokens so that a plain dot product of the flattened groups sums the
    // antidiagonal q[gS + S-1-i] · k[g'S + i].
    std::vector<float> rows = estimators::head_rows(q, i / hq, i % hq, gq * s);
    std::vector<float>& out = queries[i];
    out.resize(rows.size());
    for (int64_t g = 0; g < gq; ++g)
      for (int64_t t = 0; t < s; ++t)
        std::copy_n(rows.data() + (g * s + s - 1 - t) * dim, dim, out.data() + (g * s + t) * dim);
  });

  std::vector<float> mass(static_cast<size_t>(batch * hq * qbs * kvbs), 0.0f);
  parallel_for(threads, batch * hq * qbs, [&](int64_t task, int) {
    const int64_t bh = task / qbs, r = task % qbs, b = bh / hq, h = bh % hq;
    const float* kg = keys[b * hkv + h / group].data();
    const float* qg = queries[bh].data();
    float* out = mass.data() + task * kvbs;
    const int64_t width = s * dim;
    const int64_t g_begin = r * groups_per_qb, g_end = std::min(gq, (r + 1) * groups_per_qb);
    // 4 query groups x 4 key groups per step: 8 row loads feed 16 dot products.
    std::vector<float> logits(static_cast<size_t>(4 * gk));
    for (int64_t g0 = g_begin; g0 < g_end; g0 += 4) {
      const int64_t n = std::min<int64_t>(4, g_end - g0);
      const float* q0 = qg + g0 * width;
      const float* q1 = qg + (g0 + std::min<int64_t>(1, n - 1)) * width;
      const float* q2 = qg + (g0 + std::min<int64_t>(2, n - 1)) * width;
      const float* q3 = qg + (g0 + std::min<int64_t>(3, n - 1)) * width;
      for (int64_t c0 = 0; c0 < gk; c0 += 4) {
        const int64_t m = std::min<int64_t>(4, gk - c0);
        const float* k0 = kg + c0 * width;
        const float* k1 = kg + (c0 + std::min<int64_t>(1, m - 1)) * width;
        const float* k2 = kg + (c0 + std::min<int64_t>(2, m - 1)) * width;
        const float* k3 = kg + (c0 + std::min<int64_t>(3, m - 1)) * width;
        float a00 = 0, a01 = 0, a02 = 0, a03 = 0, a10 = 0, a11 = 0, a12 = 0, a13 = 0;
        float a20 = 0, a21 = 0, a22 = 0, a23 = 0, a30 = 0, a31 = 0, a32 = 0, a33 = 0;
#pragma omp simd reduction(+ : a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33)
        for (int64_t i = 0; i < width; ++i) {
          const float x0 = q0[i], x1 = q1[i], x2 = q2[i], x3 = q3[i];
          const float y0 = k0[i], y1 = k1[i], y2 = k2[i], y3 = k3[i];
          a00 += x0 * y0; a01 += x0 * y1; a02 += x0 * y2; a03 += x0 * y3;
          a10 += x1 * y0; a11 += x1 * y1; a12 += x1 * y2; a13 += x1 * y3;
          a20 += x2 * y0; a21 += x2 * y1; a22 += x2 * y2; a23 += x2 * y3;
          a30 += x3 * y0; a31 += x3 * y1; a32 += x3 * y2; a33 += x3 * y3;
        }
        const float tile[4][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}, {a30, a31, a32, a33}};
        for (int64_t j = 0; j < 4; ++j)
          for (int64_t c = 0; c < m; ++c) logits[j * gk + c0 + c] = tile[j][c] * scale;
      }
      for (int64_t j = 0; j < n; ++j) {
        float* row = logits.data() + j * gk;
        const float max_logit = *std::max_element(row, row + gk);
        float total = 0.0f;
        for (int64_t g2 = 0; g2 < gk; ++g2) total += (row[g2] = std::exp(row[g2] - max_logit));
        const float inv = 1.0f / total;
        for (int64_t g2 = 0; g2 < gk; ++g2) out[g2 / groups_per_kvb] += row[g2] * inv;
      }
    }
  });
  return mass;
}

}  // namespace

std::vector<float> xattention_block_mass(const ExecContext& ctx, const TensorView& q, const TensorView& k, const XAttentionOptions& options) {
  estimators::check_qk(q, k, "xattention_block_mass");
  check_options(options);
  return block_mass(ctx.threads(), q, k, options);
}

EstimateResult estimate_xattention_mask(const ExecContext& ctx, const TensorView& q, const TensorView& k, const XAttentionOptions& options) {
  estimators::check_qk(q, k, "estimate_xattention_mask");
  check_options(options);
  if (!options.per_head_threshold.empty() && static_cast<int64_t>(options.per_head_threshold.size()) != q.size(2))
    fail_argument("xattention.per_head_threshold", detail::concat(q.size(2), " values (one per query head)"),
                  options.per_head_threshold.size());
  const auto start = std::chrono::steady_clock::now();
  const int64_t batch = q.size(0), hq = q.size(2), hkv = k.size(2), group = hq / hkv;
  const BlockMaskShape per_head{batch, hq, q.size(1), k.size(1), options.block_q, options.block_kv};
  const int64_t qbs = per_head.q_blocks(), kvbs = per_head.kv_blocks();
  const std::vector<float> mass = block_mass(ctx.threads(), q, k, options);

  AlwaysKeep forced;
  forced.diagonal = options.keep_diagonal;
  forced.sink_blocks = options.keep_first ? 1 : 0;
  std::vector<uint8_t> dense(mass.size(), 0);
  apply_always_keep(per_head, forced, nullptr, dense);
  parallel_for(ctx.threads(), batch * hq * qbs, [&](int64_t row_index, int) {
    const float* m = mass.data() + row_index * kvbs;
    uint8_t* row = dense.data() + row_index * kvbs;
    double total = 0.0, kept = 0.0;
    std::vector<int32_t> order;
    for (int64_t c = 0; c < kvbs; ++c) {
      total += m[c];
      if (row[c]) kept += m[c];
      else order.push_back(static_cast<int32_t>(c));
    }
    std::sort(order.begin(), order.end(), [m](int32_t a, int32_t b) { return m[a] > m[b] || (m[a] == m[b] && a < b); });
    const int64_t head = (row_index / qbs) % hq;
    const double tau = options.per_head_threshold.empty() ? options.threshold : options.per_head_threshold[head];
    const double target = tau * total;
    for (size_t i = 0; i < order.size() && kept < target; ++i) {
      row[order[i]] = 1;
      kept += m[order[i]];
    }
  });

  BlockMaskShape shape = per_head;
  if (options.gqa_any && group > 1) {
    shape.mask_heads = hkv;
    std::vector<uint8_t> merged(static_cast<size_t>(batch * hkv * qbs * kvbs), 0);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t i = 0; i < qbs * kvbs; ++i)
          merged[((b * hkv + h / group) * qbs) * kvbs + i] |= dense[((b * hq + h) * qbs) * kvbs + i];
    dense = std::move(merged);
  }
  if (options.vote != XAttentionVote::kNone) {
    const int64_t heads = shape.mask_heads;
    std::vector<uint8_t> voted(static_cast<size_t>(batch * qbs * kvbs), 0);
    for (int64_t b = 0; b < batch; ++b) {
      const uint8_t* base = dense.data() + b * heads * qbs * kvbs;
      uint8_t* out = voted.data() + b * qbs * kvbs;
      if (options.vote == XAttentionVote::kHeads) {
        for (int64_t i = 0; i < qbs * kvbs; ++i) {
          int64_t votes = 0;
          for (int64_t h = 0; h < heads; ++h) votes += base[h * qbs * kvbs + i];
          out[i] = 2 * votes > heads ? 1 : 0;
        }
      } else {
        for (int64_t c = 0; c < kvbs; ++c) {
          int64_t votes = 0;
          for (int64_t i = 0; i < heads * qbs; ++i) votes += base[i * kvbs + c];
          const bool keep = 2 * votes > heads * qbs || c == 0 || c == kvbs - 1;
          for (int64_t r = 0; r < qbs; ++r) out[r * kvbs + c] = keep ? 1 : 0;
        }
      }
    }
    shape.mask_heads = 1;
    dense = std::move(voted);
    apply_always_keep(shape, forced, nullptr, dense);
  }
  EstimateResult result{BlockMask::from_dense(shape, dense), 0.0};
  result.estimate_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace tessel
