// XAttention-BSA scoring on the host: the chunk's queries (read back when on a device) against the
// history keys read from the engine's host cache (after its pending offloads).
#include <algorithm>
#include <cmath>

#include "host_floats.h"
#include "tessel/core/error.h"
#include "tessel/core/parallel.h"
#include "tessel/sparse/estimators/block_scoring.h"
#include "xattention_scoring.h"

namespace tessel::kv {

std::vector<float> score_on_host(OffloadEngine& engine, const PolicyContext& ctx, std::span<const int32_t> available,
                                 const XAttentionGeometry& g, SelectionStats& stats) {
  const int64_t n = g.blocks, s = g.stride, d = g.dim, heads = g.heads, kv_heads = g.kv_heads;
  const int64_t group = heads / kv_heads, q_rows = g.q_rows, width = s * d;
  std::vector<float> mass(static_cast<size_t>(g.mass_size()), 0.0f);

  // Reshaped queries Q_r[h][i] = [q_{is+s-1}, ..., q_{is}] (head h): the head's rows, then each
  // stride group's tokens reversed.
  const std::vector<float> q = to_host_floats(ctx.query);
  if (!ctx.query.device().is_cpu()) stats.score_bytes_d2h += static_cast<int64_t>(ctx.query.nbytes());
  std::vector<float> q_r(static_cast<size_t>(heads * q_rows * width));
  std::vector<float> head(static_cast<size_t>(q_rows * width));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < q_rows * s; ++t)
      std::copy_n(&q[static_cast<size_t>((t * heads + h) * d)], d, &head[static_cast<size_t>(t * d)]);
    block_scoring::reverse_stride_groups(head.data(), q_rows, s, d, &q_r[static_cast<size_t>(h * q_rows * width)]);
  }

  // Reshaped key columns per history block (a partial block's tail shorter than s is not scored).
  engine.wait_offloads(ctx.layer_id);
  std::vector<int64_t> column_start(static_cast<size_t>(n) + 1, 0);
  for (int64_t b = 0; b < n; ++b)
    column_start[static_cast<size_t>(b) + 1] =
        column_start[static_cast<size_t>(b)] + ctx.block_tokens[static_cast<size_t>(b)] / s;
  const int64_t columns = column_start[static_cast<size_t>(n)];
  if (columns == 0) return mass;  // nothing scored: no block has mass
  std::vector<float> k_r(static_cast<size_t>(kv_heads * columns * width));
  parallel_for(n, [&](int64_t b) {
    const int64_t cols = column_start[static_cast<size_t>(b) + 1] - column_start[static_cast<size_t>(b)];
    if (cols == 0) return;
    const TensorView k_block = engine.host_block(ctx.layer_id, available[static_cast<size_t>(b)]).first;
    const TensorView valid(k_block.data(), k_block.dtype(), Device::cpu(), {1, cols * s, kv_heads, d});
    const std::vector<float> k = to_host_floats(valid);
    for (int64_t kv = 0; kv < kv_heads; ++kv)
      for (int64_t j = 0; j < cols; ++j)
        for (int64_t t = 0; t < s; ++t) {
          const float* src = &k[static_cast<size_t>(((j * s + t) * kv_heads + kv) * d)];
          std::copy(src, src + d,
                    &k_r[static_cast<size_t>(((kv * columns + column_start[static_cast<size_t>(b)] + j) * s + t) * d)]);
        }
  });
  std::vector<int32_t> column_block(static_cast<size_t>(columns));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t j = column_start[static_cast<size_t>(b)]; j < column_start[static_cast<size_t>(b) + 1]; ++j)
      column_block[static_cast<size_t>(j)] = static_cast<int32_t>(b);

  parallel_for(heads * g.q_blocks, [&](int64_t task) {
    const int64_t h = task / g.q_blocks, qb = task % g.q_blocks, kv = h / group;
    const int64_t first_row = qb * g.rows_per_qblock;
    std::vector<double> block_mass(static_cast<size_t>(n), 0.0);
    block_scoring::add_antidiagonal_mass(&q_r[static_cast<size_t>((h * q_rows + first_row) * width)], g.rows_in(qb),
                                         &k_r[static_cast<size_t>(kv * columns * width)], columns, width, g.scale,
                                         column_block, block_mass);
    for (int64_t b = 0; b < n; ++b)
      mass[static_cast<size_t>(task * n + b)] = static_cast<float>(block_mass[static_cast<size_t>(b)]);
  });
  return mass;
}

#ifndef TESSEL_WITH_CUDA
// CPU-only build: the device scorer lives in xattention_scoring_cuda.cc, which is not compiled.
std::string device_scoring_unavailable(const OffloadEngine& engine, const PolicyContext&, const XAttentionGeometry&) {
  return engine.device().is_cuda() ? "tessel was built without CUDA" : "the offload engine is on the CPU";
}

std::vector<float> score_on_device(OffloadEngine&, const PolicyContext&, std::span<const int32_t>,
                                   const XAttentionGeometry&, SelectionStats&) {
  throw Error("XAttention device scoring: tessel was built without CUDA (configure with -DTESSEL_CUDA=ON)");
}
#endif

}  // namespace tessel::kv
