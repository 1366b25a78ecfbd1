// XAttention-BSA block selection on the host (see policies.h for the algorithm). Keys are read
// from the engine's host cache (after its pending offloads), so estimation costs no transfers.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "host_floats.h"
#include "tessel/core/error.h"
#include "tessel/core/parallel.h"
#include "tessel/kernels/attention.h"
#include "tessel/kv/policies.h"

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

XAttentionBsaPolicy::XAttentionBsaPolicy(XAttentionOptions options) : options_(options) {
  if (!(options.threshold > 0 && options.threshold <= 1))
    fail_argument("xattention.threshold", "in (0, 1]", options.threshold);
  if (options.stride < 1) fail_argument("xattention.stride", ">= 1", options.stride);
  if (!(options.vote_threshold >= 0 && options.vote_threshold < 1))
    fail_argument("xattention.vote_threshold", "in [0, 1)", options.vote_threshold);
}

std::vector<int32_t> XAttentionBsaPolicy::select_blocks(const std::vector<int32_t>& available, OffloadEngine& engine,
                                                        const PolicyContext& ctx) {
  if (!ctx.is_prefill) fail_phase("decode");
  const int64_t n = static_cast<int64_t>(available.size());
  if (n <= 2) return available;  // first and last are always kept
  const OffloadConfig& c = engine.config();
  const int64_t s = options_.stride;
  if (c.block_size % s != 0)
    fail_argument("block_size", detail::concat("a multiple of the XAttention stride ", s), c.block_size);
  if (static_cast<int64_t>(ctx.block_tokens.size()) != n)
    fail_argument("ctx.block_tokens.size()", n, ctx.block_tokens.size());
  const TensorView& query = ctx.query;
  const int64_t heads = query.size(2), d = c.head_dim, kv_heads = c.num_kv_heads;
  const int64_t group = heads / kv_heads;
  const int64_t q_rows = query.size(1) / s;  // reshaped query rows; a tail shorter than s is not scored
  if (q_rows == 0) return available;

  const int64_t width = s * d;                 // reshaped feature width
  const int64_t rows_per_qblock = c.block_size / s;
  const int64_t q_blocks = (q_rows + rows_per_qblock - 1) / rows_per_qblock;
  const float scale = attention_scale(AttentionOptions{}, d) / static_cast<float>(s);

  // Reshaped queries Q_r[h][i] = [q_{is+s-1}, ..., q_{is}] (head h).
  const std::vector<float> q = to_host_floats(query);
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
    column_start[static_cast<size_t>(b) + 1] = column_start[static_cast<size_t>(b)] + ctx.block_tokens[static_cast<size_t>(b)] / s;
  const int64_t columns = column_start[static_cast<size_t>(n)];
  std::vector<float> k_r(static_cast<size_t>(kv_heads * columns * width));
  parallel_for(n, [&](int64_t b) {
    const int64_t cols = column_start[static_cast<size_t>(b) + 1] - column_start[static_cast<size_t>(b)];
    if (cols == 0) return;
    const TensorView k_block = engine.host_block(ctx.layer_id, available[static_cast<size_t>(b)]).first;
    const TensorView valid(k_block.data(), k_block.dtype(), Device::cpu(), {1, cols * s, kv_heads, d});
    const std::vector<float> k = to_host_floats(valid);
    for (int64_t g = 0; g < kv_heads; ++g)
      for (int64_t j = 0; j < cols; ++j)
        for (int64_t t = 0; t < s; ++t) {
          const float* src = &k[static_cast<size_t>(((j * s + t) * kv_heads + g) * d)];
          std::copy(src, src + d,
                    &k_r[static_cast<size_t>(((g * columns + column_start[static_cast<size_t>(b)] + j) * s + t) * d)]);
        }
  });
  std::vector<int32_t> column_block(static_cast<size_t>(columns));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t j = column_start[static_cast<size_t>(b)]; j < column_start[static_cast<size_t>(b) + 1]; ++j)
      column_block[static_cast<size_t>(j)] = static_cast<int32_t>(b);

  // keep[(h * q_blocks + qb) * n + b]: head h's query block qb keeps history block b.
  std::vector<uint8_t> keep(static_cast<size_t>(heads * q_blocks * n), 0);
  parallel_for(heads * q_blocks, [&](int64_t task) {
    const int64_t h = task / q_blocks, qb = task % q_blocks, g = h / group;
    const int64_t first_row = qb * rows_per_qblock;
    const int64_t last_row = std::min(q_rows, first_row + rows_per_qblock);
    std::vector<double> block_mass(static_cast<size_t>(n), 0.0);
    // Rows are scored kRowTile at a time so each key column is read from memory once per tile.
    constexpr int64_t kRowTile = 8;
    std::vector<float> logits(static_cast<size_t>(kRowTile * columns));
    const float* keys = &k_r[static_cast<size_t>(g * columns * width)];
    for (int64_t row0 = first_row; row0 < last_row; row0 += kRowTile) {
      const int64_t tile = std::min(kRowTile, last_row - row0);
      const float* q_tile = &q_r[static_cast<size_t>((h * q_rows + row0) * width)];
      score_tile(q_tile, tile, keys, columns, width, scale, logits.data());
      for (int64_t r = 0; r < tile; ++r) {
        float* row = &logits[static_cast<size_t>(r * columns)];
        const float peak = *std::max_element(row, row + columns);
        double total = 0;
        for (int64_t j = 0; j < columns; ++j) total += (row[j] = std::exp(row[j] - peak));
        for (int64_t j = 0; j < columns; ++j)
          block_mass[static_cast<size_t>(column_block[static_cast<size_t>(j)])] += row[j] / total;
      }
    }
    // Keep the heaviest blocks until their mass reaches τ of the rows' total.
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return block_mass[static_cast<size_t>(a)] > block_mass[static_cast<size_t>(b)]; });
    const double goal = options_.threshold * static_cast<double>(last_row - first_row);
    double kept = 0;
    for (int64_t b : order) {
      if (kept >= goal) break;
      keep[static_cast<size_t>(task * n + b)] = 1;
      kept += block_mass[static_cast<size_t>(b)];
    }
  });

  // GQA: a kv head keeps a block when any query head of its group does; then majority vote over
  // (kv head, query block) pairs.
  std::vector<int64_t> votes(static_cast<size_t>(n), 0);
  for (int64_t g = 0; g < kv_heads; ++g)
    for (int64_t qb = 0; qb < q_blocks; ++qb)
      for (int64_t b = 0; b < n; ++b) {
        bool any = false;
        for (int64_t h = g * group; h < (g + 1) * group && !any; ++h)
          any = keep[static_cast<size_t>((h * q_blocks + qb) * n + b)] != 0;
        votes[static_cast<size_t>(b)] += any ? 1 : 0;
      }
  const double total_votes = static_cast<double>(kv_heads * q_blocks);
  std::vector<int32_t> selected;
  for (int64_t b = 0; b < n; ++b)
    if (b == 0 || b == n - 1 || static_cast<double>(votes[static_cast<size_t>(b)]) > options_.vote_threshold * total_votes)
      selected.push_back(available[static_cast<size_t>(b)]);
  return selected;
}

}  // namespace tessel::kv
