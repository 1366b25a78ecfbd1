// XAttention-BSA: the shapes of a call and the block selection from masses, shared by the host and
// the device scorers; the selection is the shared block-scoring τ rule, GQA any and column vote.
#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"
#include "tessel/sparse/estimators/block_scoring.h"
#include "xattention_scoring.h"

namespace tessel::kv {

int64_t XAttentionGeometry::rows_in(int64_t qb) const {
  return std::min(q_rows, (qb + 1) * rows_per_qblock) - qb * rows_per_qblock;
}

XAttentionGeometry xattention_geometry(const OffloadConfig& config, const TensorView& query, int64_t stride,
                                       int64_t blocks) {
  if (config.block_size % stride != 0)
    fail_argument("block_size", detail::concat("a multiple of the XAttention stride ", stride), config.block_size);
  if (query.dim() != 4 || query.size(0) != 1 || query.size(3) != config.head_dim ||
      query.size(2) % config.num_kv_heads != 0)
    fail_argument("ctx.query.shape",
                  detail::concat("(1, S_q, a multiple of ", config.num_kv_heads, " heads, ", config.head_dim, ")"),
                  shape_str(query.shape()));
  XAttentionGeometry g;
  g.stride = stride;
  g.heads = query.size(2);
  g.kv_heads = config.num_kv_heads;
  g.dim = config.head_dim;
  g.block_size = config.block_size;
  g.q_rows = query.size(1) / stride;
  g.rows_per_qblock = config.block_size / stride;
  g.q_blocks = (g.q_rows + g.rows_per_qblock - 1) / g.rows_per_qblock;
  g.blocks = blocks;
  g.scale = attention_scale(AttentionOptions{}, g.dim) / static_cast<float>(stride);
  return g;
}

std::vector<int64_t> select_from_block_masses(std::span<const float> mass, const XAttentionGeometry& g,
                                              double threshold, double vote_threshold) {
  const int64_t n = g.blocks;
  if (static_cast<int64_t>(mass.size()) != g.mass_size())
    fail_argument("mass.size()", detail::concat(g.mass_size(), " (heads x query blocks x blocks)"), mass.size());
  // keep[(h * q_blocks + qb) * n + b]: head h's query block qb keeps block b.
  std::vector<uint8_t> keep(static_cast<size_t>(g.mass_size()), 0);
  for (int64_t row = 0; row < g.heads * g.q_blocks; ++row)
    block_scoring::keep_until_mass(&mass[static_cast<size_t>(row * n)], n,
                                   threshold * static_cast<double>(g.rows_in(row % g.q_blocks)),
                                   &keep[static_cast<size_t>(row * n)]);
  // GQA: a kv head keeps a block when any query head of its group does; then the vote over
  // (kv head, query block) pairs, the first and last blocks always.
  const std::vector<uint8_t> per_kv_head = block_scoring::merge_gqa_any(keep, 1, g.heads, g.kv_heads, g.q_blocks * n);
  AlwaysKeep ends;
  ends.sink_blocks = 1;
  ends.recent_blocks = 1;
  const std::vector<uint8_t> kept = block_scoring::vote_columns(per_kv_head, g.kv_heads * g.q_blocks, n, vote_threshold, ends);
  std::vector<int64_t> selected;
  for (int64_t b = 0; b < n; ++b)
    if (kept[static_cast<size_t>(b)]) selected.push_back(b);
  return selected;
}

}  // namespace tessel::kv
