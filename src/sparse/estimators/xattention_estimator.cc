#include "tessel/sparse/estimators/xattention_estimator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "head_data.h"
#include "tessel/sparse/estimators/block_scoring.h"
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
  if (!(o.vote_threshold >= 0.0 && o.vote_threshold < 1.0))
    fail_argument("xattention.vote_threshold", "in [0, 1)", o.vote_threshold);
}

// Masses (B, H_q, Qb, columns) row-major: the real kv blocks first, then (padding kChunk) the
// padding blocks past the end.
struct BlockMass {
  std::vector<float> mass;
  int64_t columns = 0;
};

// Steps 1–4 of the header for every (b, h_q).
BlockMass block_mass(int threads, const TensorView& q, const TensorView& k, const XAttentionOptions& o) {
  const int64_t batch = q.size(0), seq_q = q.size(1), hq = q.size(2), dim = q.size(3);
  const int64_t seq_kv = k.size(1), hkv = k.size(2), group = hq / hkv, s = o.stride;
  const int64_t gq = (seq_q + s - 1) / s, gk = (seq_kv + s - 1) / s;
  const BlockMaskShape shape{batch, hq, seq_q, seq_kv, o.block_q, o.block_kv};
  const int64_t qbs = shape.q_blocks();
  const int64_t groups_per_qb = o.block_q / s, groups_per_kvb = o.block_kv / s;
  // Zero key groups [gk, padded_groups) and the blocks that hold them.
  const int64_t padded_groups = o.padding == XAttentionPadding::kChunk ? xattention_padded_length(seq_kv) / s : gk;
  const int64_t mass_columns = (padded_groups + groups_per_kvb - 1) / groups_per_kvb;
  std::vector<int32_t> zero_groups;
  if (padded_groups > gk) {
    zero_groups.assign(static_cast<size_t>(mass_columns), 0);
    for (int64_t g = gk; g < padded_groups; ++g) ++zero_groups[static_cast<size_t>(g / groups_per_kvb)];
  }
  const float scale = (o.scale != 0.0f ? o.scale : 1.0f / std::sqrt(static_cast<float>(dim))) / static_cast<float>(s);

  // Key groups are contiguous rows: group g' is the (S·D) vector k[g'S .. g'S+S).
  std::vector<std::vector<float>> keys(static_cast<size_t>(batch * hkv));
  parallel_for(threads, batch * hkv, [&](int64_t i, int) { keys[i] = estimators::head_rows(k, i / hkv, i % hkv, gk * s); });
  std::vector<std::vector<float>> queries(static_cast<size_t>(batch * hq));
  parallel_for(threads, batch * hq, [&](int64_t i, int) {
    const std::vector<float> rows = estimators::head_rows(q, i / hq, i % hq, gq * s);
    queries[i].resize(rows.size());
    block_scoring::reverse_stride_groups(rows.data(), gq, s, dim, queries[i].data());
  });
  std::vector<int32_t> column_block(static_cast<size_t>(gk));
  for (int64_t g = 0; g < gk; ++g) column_block[static_cast<size_t>(g)] = static_cast<int32_t>(g / groups_per_kvb);

  std::vector<float> mass(static_cast<size_t>(batch * hq * qbs * mass_columns), 0.0f);
  parallel_for(threads, batch * hq * qbs, [&](int64_t task, int) {
    const int64_t bh = task / qbs, r = task % qbs, b = bh / hq, h = bh % hq;
    const int64_t width = s * dim;
    const int64_t g_begin = r * groups_per_qb, g_end = std::min(gq, (r + 1) * groups_per_qb);
    std::vector<double> row_mass(static_cast<size_t>(mass_columns), 0.0);
    block_scoring::add_antidiagonal_mass(queries[bh].data() + g_begin * width, g_end - g_begin,
                                         keys[b * hkv + h / group].data(), gk, width, scale, column_block, row_mass,
                                         zero_groups);
    std::copy(row_mass.begin(), row_mass.end(), mass.begin() + task * mass_columns);
  });
  return BlockMass{std::move(mass), mass_columns};
}

}  // namespace

int64_t xattention_padded_length(int64_t seq_kv) {
  int64_t power = 1;
  while (power < seq_kv) power *= 2;
  const int64_t chunk = std::max<int64_t>(std::min(std::max<int64_t>(2048, power), (int64_t{1} << 28) / power), 2048);
  return (seq_kv + chunk - 1) / chunk * chunk;
}

std::vector<float> xattention_block_mass(const ExecContext& ctx, const TensorView& q, const TensorView& k, const XAttentionOptions& options) {
  estimators::check_qk(q, k, "xattention_block_mass");
  check_options(options);
  const BlockMass all = block_mass(ctx.threads(), q, k, options);
  const int64_t kvbs = (k.size(1) + options.block_kv - 1) / options.block_kv;
  const int64_t rows = static_cast<int64_t>(all.mass.size()) / all.columns;
  std::vector<float> mass(static_cast<size_t>(rows * kvbs));
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(all.mass.begin() + r * all.columns, kvbs, mass.begin() + r * kvbs);
  return mass;
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
  const BlockMass all = block_mass(ctx.threads(), q, k, options);
  const int64_t mass_columns = all.columns;

  // The diagonal counts toward the threshold; block 0 is added after the selection.
  AlwaysKeep counted;
  counted.diagonal = options.keep_diagonal;
  AlwaysKeep forced = counted;
  forced.sink_blocks = options.keep_first ? 1 : 0;
  std::vector<uint8_t> dense(static_cast<size_t>(batch * hq * qbs * kvbs), 0);
  apply_always_keep(per_head, counted, nullptr, dense);
  parallel_for(ctx.threads(), batch * hq * qbs, [&](int64_t row_index, int) {
    const float* m = all.mass.data() + row_index * mass_columns;
    const double total = std::accumulate(m, m + mass_columns, 0.0);
    const int64_t head = (row_index / qbs) % hq;
    const double tau = options.per_head_threshold.empty() ? options.threshold : options.per_head_threshold[head];
    uint8_t* row = dense.data() + row_index * kvbs;
    std::vector<uint8_t> keep(row, row + kvbs);
    keep.resize(static_cast<size_t>(mass_columns), 0);
    block_scoring::keep_until_mass(m, mass_columns, tau * total, keep.data());
    std::copy_n(keep.begin(), kvbs, row);
    if (options.keep_first) row[0] = 1;
  });

  BlockMaskShape shape = per_head;
  if (options.gqa_any && group > 1) {
    shape.mask_heads = hkv;
    dense = block_scoring::merge_gqa_any(dense, batch, hq, hkv, qbs * kvbs);
  }
  if (options.vote != XAttentionVote::kNone) {
    const int64_t heads = shape.mask_heads;
    std::vector<uint8_t> voted(static_cast<size_t>(batch * qbs * kvbs), 0);
    for (int64_t b = 0; b < batch; ++b) {
      const uint8_t* base = dense.data() + b * heads * qbs * kvbs;
      uint8_t* out = voted.data() + b * qbs * kvbs;
      if (options.vote == XAttentionVote::kHeads) {
        // A (row, column) cell is kept when more than half of the heads keep it: the column vote
        // with the heads as rows and the cells as columns.
        const std::vector<uint8_t> cells = block_scoring::vote_columns(
            std::span<const uint8_t>(base, static_cast<size_t>(heads * qbs * kvbs)), heads, qbs * kvbs, 0.5,
            AlwaysKeep{});
        std::copy(cells.begin(), cells.end(), out);
      } else {
        // The chunked-prefill vote over (head, query block) rows; the first and last kv blocks always.
        AlwaysKeep ends;
        ends.sink_blocks = 1;
        ends.recent_blocks = 1;
        const std::vector<uint8_t> columns = block_scoring::vote_columns(
            std::span<const uint8_t>(base, static_cast<size_t>(heads * qbs * kvbs)), heads * qbs, kvbs,
            options.vote_threshold, ends);
        for (int64_t r = 0; r < qbs; ++r) std::copy(columns.begin(), columns.end(), out + r * kvbs);
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
