// XAttention-BSA: the shapes of a call and the block selection from masses, shared by the host and
// the device scorers.
#include <algorithm>
#include <numeric>

#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"
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
  const int64_t n = g.blocks, group = g.heads / g.kv_heads;
  if (static_cast<int64_t>(mass.size()) != g.mass_size())
    fail_argument("mass.size()", detail::concat(g.mass_size(), " (heads x query blocks x blocks)"), mass.size());
  // keep[(h * q_blocks + qb) * n + b]: head h's query block qb keeps block b.
  std::vector<uint8_t> keep(static_cast<size_t>(g.mass_size()), 0);
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t row = 0; row < g.heads * g.q_blocks; ++row) {
    const float* m = &mass[static_cast<size_t>(row * n)];
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return m[a] > m[b]; });
    const double goal = threshold * static_cast<double>(g.rows_in(row % g.q_blocks));
    double kept = 0;
    for (int64_t b : order) {
      if (kept >= goal) break;
      keep[static_cast<size_t>(row * n + b)] = 1;
      kept += m[b];
    }
  }
  // GQA: a kv head keeps a block when any query head of its group does; then the vote over
  // (kv head, query block) pairs.
  std::vector<int64_t> votes(static_cast<size_t>(n), 0);
  for (int64_t kv = 0; kv < g.kv_heads; ++kv)
    for (int64_t qb = 0; qb < g.q_blocks; ++qb)
      for (int64_t b = 0; b < n; ++b) {
        bool any = false;
        for (int64_t h = kv * group; h < (kv + 1) * group && !any; ++h)
          any = keep[static_cast<size_t>((h * g.q_blocks + qb) * n + b)] != 0;
        votes[static_cast<size_t>(b)] += any ? 1 : 0;
      }
  const double total_votes = static_cast<double>(g.kv_heads * g.q_blocks);
  std::vector<int64_t> selected;
  for (int64_t b = 0; b < n; ++b)
    if (b == 0 || b == n - 1 || static_cast<double>(votes[static_cast<size_t>(b)]) > vote_threshold * total_votes)
      selected.push_back(b);
  return selected;
}

}  // namespace tessel::kv
