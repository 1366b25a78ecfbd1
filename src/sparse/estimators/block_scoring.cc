#include "tessel/sparse/estimators/block_scoring.h"

#include <algorithm>
#include <cmath>

#include "tessel/core/error.h"

namespace tessel::block_scoring {
namespace {

// logits[j·columns + c] = scale · rows[j] · columns[c] for up to 4 rows and all columns: 4 rows x 4
// columns per step, so 8 loads feed 16 dot products. Cloned per ISA so that a portable build
// still uses AVX2 / AVX-512 where the machine has them (this is the host-side cost of XAttention).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void antidiagonal_logits(const float* rows, int64_t num_rows, const float* columns, int64_t num_columns, int64_t width,
                         float scale, float* logits) {
  const float* q0 = rows;
  const float* q1 = rows + std::min<int64_t>(1, num_rows - 1) * width;
  const float* q2 = rows + std::min<int64_t>(2, num_rows - 1) * width;
  const float* q3 = rows + std::min<int64_t>(3, num_rows - 1) * width;
  for (int64_t c0 = 0; c0 < num_columns; c0 += 4) {
    const int64_t m = std::min<int64_t>(4, num_columns - c0);
    const float* k0 = columns + c0 * width;
    const float* k1 = columns + (c0 + std::min<int64_t>(1, m - 1)) * width;
    const float* k2 = columns + (c0 + std::min<int64_t>(2, m - 1)) * width;
    const float* k3 = columns + (c0 + std::min<int64_t>(3, m - 1)) * width;
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
    for (int64_t j = 0; j < std::min<int64_t>(4, num_rows); ++j)
      for (int64_t c = 0; c < m; ++c) logits[j * num_columns + c0 + c] = tile[j][c] * scale;
  }
}

// The blocks not yet kept, by score descending and index ascending on ties.
template <typename Score>
std::vector<int32_t> ranked_others(const Score* score, int64_t n, const uint8_t* keep) {
  std::vector<int32_t> order;
  for (int64_t c = 0; c < n; ++c)
    if (!keep[c]) order.push_back(static_cast<int32_t>(c));
  std::sort(order.begin(), order.end(),
            [score](int32_t a, int32_t b) { return score[a] > score[b] || (score[a] == score[b] && a < b); });
  return order;
}

}  // namespace

void reverse_stride_groups(const float* rows, int64_t groups, int64_t stride, int64_t dim, float* out) {
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t t = 0; t < stride; ++t)
      std::copy_n(rows + (g * stride + stride - 1 - t) * dim, dim, out + (g * stride + t) * dim);
}

void add_antidiagonal_mass(const float* rows, int64_t num_rows, const float* columns, int64_t num_columns,
                           int64_t width, float scale, std::span<const int32_t> column_block, std::span<double> mass,
                           std::span<const int32_t> zero_columns_per_block) {
  TESSEL_CHECK(static_cast<int64_t>(column_block.size()) == num_columns, "add_antidiagonal_mass: column_block has ",
               column_block.size(), " entries for ", num_columns, " columns");
  TESSEL_CHECK(zero_columns_per_block.empty() || zero_columns_per_block.size() == mass.size(),
               "add_antidiagonal_mass: zero_columns_per_block has ", zero_columns_per_block.size(), " entries for ",
               mass.size(), " blocks");
  int64_t zero_columns = 0;
  for (int32_t n : zero_columns_per_block) zero_columns += n;
  if (num_columns == 0) return;
  std::vector<float> logits(static_cast<size_t>(4 * num_columns));
  for (int64_t r0 = 0; r0 < num_rows; r0 += 4) {
    const int64_t n = std::min<int64_t>(4, num_rows - r0);
    antidiagonal_logits(rows + r0 * width, n, columns, num_columns, width, scale, logits.data());
    for (int64_t j = 0; j < n; ++j) {
      float* row = logits.data() + j * num_columns;
      float peak = *std::max_element(row, row + num_columns);
      if (zero_columns > 0) peak = std::max(peak, 0.0f);
      double total = 0.0;
      for (int64_t c = 0; c < num_columns; ++c) total += (row[c] = std::exp(row[c] - peak));
      const float zero_weight = std::exp(-peak);
      total += static_cast<double>(zero_columns) * zero_weight;
      for (int64_t c = 0; c < num_columns; ++c) mass[static_cast<size_t>(column_block[static_cast<size_t>(c)])] += row[c] / total;
      for (size_t b = 0; b < zero_columns_per_block.size(); ++b)
        mass[b] += static_cast<double>(zero_columns_per_block[b]) * zero_weight / total;
    }
  }
}

void pooled_softmax_scores(const float* pooled_q, const float* pooled_k, std::span<const int32_t> candidates,
                           int64_t dim, float scale, float* prob) {
  if (candidates.empty()) return;
  float max_score = -INFINITY;
  for (int32_t c : candidates) {
    prob[c] = scale * dot(pooled_q, pooled_k + c * dim, dim);
    max_score = std::max(max_score, prob[c]);
  }
  float total = 0.0f;
  for (int32_t c : candidates) total += (prob[c] = std::exp(prob[c] - max_score));
  for (int32_t c : candidates) prob[c] /= total;
}

void keep_top_k(const float* score, int64_t n, int64_t k, uint8_t* keep) {
  const std::vector<int32_t> order = ranked_others(score, n, keep);
  for (size_t i = 0; i < std::min(order.size(), static_cast<size_t>(std::max<int64_t>(k, 0))); ++i) keep[order[i]] = 1;
}

void keep_top_k(const double* score, int64_t n, int64_t k, uint8_t* keep) {
  const std::vector<int32_t> order = ranked_others(score, n, keep);
  for (size_t i = 0; i < std::min(order.size(), static_cast<size_t>(std::max<int64_t>(k, 0))); ++i) keep[order[i]] = 1;
}

void keep_until_cdf(const float* score, int64_t n, double p, uint8_t* keep) {
  const std::vector<int32_t> order = ranked_others(score, n, keep);
  float cumulative = 0.0f;
  for (int32_t c : order) {
    keep[c] = 1;
    cumulative += score[c];
    if (static_cast<double>(cumulative) >= p) break;
  }
}

void keep_while_cdf_at_most(const float* score, int64_t n, double p, uint8_t* keep) {
  const std::vector<int32_t> order = ranked_others(score, n, keep);
  const float limit = static_cast<float>(p);
  float cumulative = 0.0f;
  for (size_t i = 0; i < order.size(); ++i) {
    cumulative += score[order[i]];
    if (i > 0 && cumulative > limit) break;
    keep[order[i]] = 1;
  }
}

void keep_until_mass(const float* score, int64_t n, double target, uint8_t* keep) {
  double kept = 0.0;
  for (int64_t c = 0; c < n; ++c)
    if (keep[c]) kept += score[c];
  const std::vector<int32_t> order = ranked_others(score, n, keep);
  for (size_t i = 0; i < order.size() && kept < target; ++i) {
    keep[order[i]] = 1;
    kept += score[order[i]];
  }
}

void keep_sink_and_recent(const AlwaysKeep& always, int64_t n, uint8_t* keep) {
  for (int64_t c = 0; c < std::min(always.sink_blocks, n); ++c) keep[c] = 1;
  for (int64_t c = std::max<int64_t>(0, n - always.recent_blocks); c < n; ++c) keep[c] = 1;
}

std::vector<uint8_t> merge_gqa_any(std::span<const uint8_t> per_head, int64_t batch, int64_t heads, int64_t kv_heads,
                                   int64_t plane) {
  TESSEL_CHECK(static_cast<int64_t>(per_head.size()) == batch * heads * plane, "merge_gqa_any: ", per_head.size(),
               " entries, expected ", batch * heads * plane);
  const int64_t group = heads / kv_heads;
  std::vector<uint8_t> merged(static_cast<size_t>(batch * kv_heads * plane), 0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < plane; ++i)
        merged[static_cast<size_t>((b * kv_heads + h / group) * plane + i)] |=
            per_head[static_cast<size_t>((b * heads + h) * plane + i)];
  return merged;
}

std::vector<uint8_t> vote_columns(std::span<const uint8_t> keep, int64_t rows, int64_t columns, double vote_fraction,
                                  const AlwaysKeep& always) {
  TESSEL_CHECK(static_cast<int64_t>(keep.size()) == rows * columns, "vote_columns: ", keep.size(),
               " entries, expected ", rows * columns);
  std::vector<uint8_t> kept(static_cast<size_t>(columns), 0);
  keep_sink_and_recent(always, columns, kept.data());
  const double needed = vote_fraction * static_cast<double>(rows);
  for (int64_t c = 0; c < columns; ++c) {
    int64_t votes = 0;
    for (int64_t r = 0; r < rows; ++r) votes += keep[static_cast<size_t>(r * columns + c)];
    if (static_cast<double>(votes) > needed) kept[static_cast<size_t>(c)] = 1;
  }
  return kept;
}

}  // namespace tessel::block_scoring
