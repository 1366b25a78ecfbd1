// XAttention-BSA scoring on the host: the chunk's queries (read back when on a device) against the
// history keys read from the engine's host cache (after its pending offloads).
#include <algorithm>
#include <cmath>

#include "host_floats.h"
#include "tessel/core/error.h"
#include "tessel/core/parallel.h"
#include "xattention_scoring.h"

namespace tessel::kv {
namespace {

// Dot product with independent partial sums, so the compiler can vectorize without -ffast-math.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  float sum = 0;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (float x : acc) sum += x;
  return sum;
}

// logits[r * columns + j] = scale · q_tile[r] · keys[j] for `tile` query rows and all key columns,
// each key column read once per tile. Cloned per ISA: a portable build still gets AVX2 / AVX-512
// on machines that have them (the estimator is the host-side cost of XAttention).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void score_tile(const float* q_tile, int64_t tile, const float* keys, int64_t columns, int64_t width, float scale,
                float* logits) {
  for (int64_t j = 0; j < columns; ++j)
    for (int64_t r = 0; r < tile; ++r) logits[r * columns + j] = dot(q_tile + r * width, keys + j * width, width) * scale;
}

}  // namespace

std::vector<float> score_on_host(OffloadEngine& engine, const PolicyContext& ctx, std::span<const int32_t> available,
                                 const XAttentionGeometry& g, SelectionStats& stats) {
  const int64_t n = g.blocks, s = g.stride, d = g.dim, heads = g.heads, kv_heads = g.kv_heads;
  const int64_t group = heads / kv_heads, q_rows = g.q_rows, width = s * d;
  std::vector<float> mass(static_cast<size_t>(g.mass_size()), 0.0f);

  // Reshaped queries Q_r[h][i] = [q_{is+s-1}, ..., q_{is}] (head h).
  const std::vector<float> q = to_host_floats(ctx.query);
  if (!ctx.query.device().is_cpu()) stats.score_bytes_d2h += static_cast<int64_t>(ctx.query.nbytes());
  std::vector<float> q_r(static_cast<size_t>(heads * q_rows * width));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < q_rows; ++i)
      for (int64_t t = 0; t < s; ++t) {
        const float* src = &q[static_cast<size_t>(((i * s + s - 1 - t) * heads + h) * d)];
        std::copy(src, src + d, &q_r[static_cast<size_t>(((h * q_rows + i) * s + t) * d)]);
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
    const int64_t last_row = first_row + g.rows_in(qb);
    std::vector<double> block_mass(static_cast<size_t>(n), 0.0);
    // Rows are scored kRowTile at a time so each key column is read from memory once per tile.
    constexpr int64_t kRowTile = 8;
    std::vector<float> logits(static_cast<size_t>(kRowTile * columns));
    const float* keys = &k_r[static_cast<size_t>(kv * columns * width)];
    for (int64_t row0 = first_row; row0 < last_row; row0 += kRowTile) {
      const int64_t tile = std::min(kRowTile, last_row - row0);
      const float* q_tile = &q_r[static_cast<size_t>((h * q_rows + row0) * width)];
      score_tile(q_tile, tile, keys, columns, width, g.scale, logits.data());
      for (int64_t r = 0; r < tile; ++r) {
        float* row = &logits[static_cast<size_t>(r * columns)];
        const float peak = *std::max_element(row, row + columns);
        double total = 0;
        for (int64_t j = 0; j < columns; ++j) total += (row[j] = std::exp(row[j] - peak));
        for (int64_t j = 0; j < columns; ++j)
          block_mass[static_cast<size_t>(column_block[static_cast<size_t>(j)])] += row[j] / total;
      }
    }
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
