// Tiled attention on the CPU (FlashAttention's online softmax, fp32 accumulation).
//
// Work is split into items (batch, head group, query tile), run in parallel. A head group is the
// GQA group sharing one kv head (or a single query head when a per-query-head mask gives each head
// its own kv blocks), so each K/V tile is converted to fp32 once and reused by every query row of
// the group. An item walks a list of key ranges: for dense attention the causal/window band of
// its rows, for block-sparse the kept kv blocks of its mask row (clipped to that band). Both share
// process_item(); the token-level causal/window mask is applied only to chunks that straddle the
// band's edge.
#include "kernels/cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/tile_kernels.h"
#include "tessel/core/dtype.h"
#include "tessel/core/parallel.h"

namespace tessel::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kChunkKeys = 64;     // keys per inner tile
constexpr int64_t kTileRowsTarget = 64;  // query rows (all heads of a group) per item

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

struct Operand {
  const char* base;
  int64_t sb, ss, sh;  // element strides of batch, sequence, head (head_dim stride is 1)
  size_t elem;
  const char* row(int64_t b, int64_t s, int64_t h) const {
    return base + static_cast<size_t>(b * sb + s * ss + h * sh) * elem;
  }
};

Operand operand(const TensorView& t) {
  return {static_cast<const char*>(t.data()), t.stride(0), t.stride(1), t.stride(2), dtype_size(t.dtype())};
}

struct Problem {
  DType dtype;
  Operand q, k, v, out;
  float* lse;  // (B, H, S_q) contiguous, or null
  int64_t batch, seq_q, seq_kv, heads, kv_heads, head_dim, group;
  float scale_log2;  // scale * log2(e): scores live in the log2 domain so exp2 does the softmax
  AttentionOptions options;
  const BlockMaskView* mask;  // null for dense
  int64_t heads_per_item;
  int64_t rows_per_head;  // query tile height per head
};

// Keys visible to query i are [key_lo(i), key_hi(i)] (empty when lo > hi); both are non-decreasing in i.
int64_t key_lo(const Problem& p, int64_t i) {
  if (p.options.window_left < 0) return 0;
  return std::max<int64_t>(0, i + p.seq_kv - p.seq_q - p.options.window_left);
}
int64_t key_hi(const Problem& p, int64_t i) {
  const int64_t diagonal = i + p.seq_kv - p.seq_q;
  int64_t hi = p.seq_kv - 1;
  if (p.options.window_right >= 0) hi = std::min(hi, diagonal + p.options.window_right);
  if (p.options.causal) hi = std::min(hi, diagonal);
  return hi;
}

template <typename T>
void load_row(const char* src, int64_t n, float scale, float* dst) {
  const T* s = reinterpret_cast<const T*>(src);
  for (int64_t d = 0; d < n; ++d) dst[d] = to_float(s[d]) * scale;
}

void load_row_any(DType dtype, const char* src, int64_t n, float scale, float* dst) {
  switch (dtype) {
    case DType::kF32: return load_row<float>(src, n, scale, dst);
    case DType::kF16: return load_row<Half>(src, n, scale, dst);
    default: return load_row<BFloat16>(src, n, scale, dst);
  }
}

void store_row_any(DType dtype, const float* src, int64_t n, float scale, char* dst) {
  switch (dtype) {
    case DType::kF32:
      for (int64_t d = 0; d < n; ++d) reinterpret_cast<float*>(dst)[d] = src[d] * scale;
      return;
    case DType::kF16:
      for (int64_t d = 0; d < n; ++d) reinterpret_cast<Half*>(dst)[d] = from_float<Half>(src[d] * scale);
      return;
    default:
      for (int64_t d = 0; d < n; ++d) reinterpret_cast<BFloat16*>(dst)[d] = from_float<BFloat16>(src[d] * scale);
      return;
  }
}

struct Workspace {
  std::vector<float> q, kt, v, s, o, alpha, row_max, row_sum;
};

struct KeyRange {
  int64_t begin, end;  // [begin, end)
};

// Runs one item: query rows [i0, i1) of heads [h0, h0 + heads_per_item) over the key ranges.
void process_item(const Problem& p, int64_t b, int64_t h0, int64_t i0, int64_t i1,
                  const std::vector<KeyRange>& ranges, Workspace& ws) {
  const int64_t rows = i1 - i0, heads = p.heads_per_item, m = rows * heads;
  const int64_t dp = round_up(p.head_dim, 16), ld_s = kChunkKeys;
  const int64_t hk = h0 / p.group;
  ws.q.assign(static_cast<size_t>(m * dp), 0.0f);
  ws.o.assign(static_cast<size_t>(m * dp), 0.0f);
  ws.kt.assign(static_cast<size_t>(dp * ld_s), 0.0f);
  ws.v.assign(static_cast<size_t>(ld_s * dp), 0.0f);
  ws.s.resize(static_cast<size_t>(m * ld_s));
  ws.alpha.resize(static_cast<size_t>(m));
  ws.row_max.assign(static_cast<size_t>(m), kNegInf);
  ws.row_sum.assign(static_cast<size_t>(m), 0.0f);
  for (int64_t g = 0; g < heads; ++g)
    for (int64_t r = 0; r < rows; ++r)
      load_row_any(p.dtype, p.q.row(b, i0 + r, h0 + g), p.head_dim, p.scale_log2, &ws.q[static_cast<size_t>((g * rows + r) * dp)]);

  std::vector<float> key_row(static_cast<size_t>(p.head_dim));
  for (const KeyRange& range : ranges) {
    for (int64_t j0 = range.begin; j0 < range.end; j0 += kChunkKeys) {
      const int64_t j1 = std::min(range.end, j0 + kChunkKeys), n = j1 - j0;
      // Pack K transposed and V, both fp32; the padding stays zero.
      for (int64_t c = 0; c < ld_s; ++c) {
        if (c < n) {
          load_row_any(p.dtype, p.k.row(b, j0 + c, hk), p.head_dim, 1.0f, key_row.data());
          for (int64_t d = 0; d < p.head_dim; ++d) ws.kt[static_cast<size_t>(d * ld_s + c)] = key_row[static_cast<size_t>(d)];
          load_row_any(p.dtype, p.v.row(b, j0 + c, hk), p.head_dim, 1.0f, &ws.v[static_cast<size_t>(c * dp)]);
        } else {
          for (int64_t d = 0; d < p.head_dim; ++d) ws.kt[static_cast<size_t>(d * ld_s + c)] = 0.0f;
        }
      }
      tile_scores(ws.q.data(), m, dp, ws.kt.data(), ld_s, ws.s.data());
      // Token-level mask only where the chunk crosses the band edge of some row.
      const bool whole = key_lo(p, i1 - 1) <= j0 && j1 - 1 <= key_hi(p, i0);
      for (int64_t row = 0; row < m; ++row) {
        float* s = &ws.s[static_cast<size_t>(row * ld_s)];
        if (!whole) {
          const int64_t i = i0 + row % rows;
          const int64_t lo = key_lo(p, i) - j0, hi = key_hi(p, i) - j0;
          for (int64_t c = 0; c < n; ++c)
            if (c < lo || c > hi) s[c] = kNegInf;
        }
        ws.alpha[static_cast<size_t>(row)] =
            tile_softmax_row(s, n, ld_s, ws.row_max[static_cast<size_t>(row)], ws.row_sum[static_cast<size_t>(row)]);
      }
      tile_accumulate(ws.s.data(), m, ld_s, n, ws.v.data(), dp, ws.alpha.data(), ws.o.data());
    }
  }

  constexpr float kLn2 = 0.693147180559945309f;
  for (int64_t g = 0; g < heads; ++g)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t row = g * rows + r;
      const float sum = ws.row_sum[static_cast<size_t>(row)];
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // a row with no key gets 0
      store_row_any(p.dtype, &ws.o[static_cast<size_t>(row * dp)], p.head_dim, inv,
                    const_cast<char*>(p.out.row(b, i0 + r, h0 + g)));
      if (p.lse)
        p.lse[((b * p.heads) + h0 + g) * p.seq_q + i0 + r] =
            sum > 0.0f ? (ws.row_max[static_cast<size_t>(row)] + std::log2(sum)) * kLn2 : kNegInf;
    }
}

Problem make_problem(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                     const TensorView& lse, const AttentionOptions& options, const BlockMaskView* mask) {
  Problem p{};
  p.dtype = q.dtype();
  p.q = operand(q);
  p.k = operand(k);
  p.v = operand(v);
  p.out = operand(out);
  p.lse = lse.empty() ? nullptr : lse.data_as<float>();
  p.batch = q.size(0);
  p.seq_q = q.size(1);
  p.heads = q.size(2);
  p.head_dim = q.size(3);
  p.seq_kv = k.size(1);
  p.kv_heads = k.size(2);
  p.group = p.heads / p.kv_heads;
  p.scale_log2 = attention_scale(options, p.head_dim) * 1.4426950408889634f;
  p.options = options;
  p.mask = mask;
  const bool per_q_head_mask = mask && mask->mask_heads == p.heads && p.group > 1;
  p.heads_per_item = per_q_head_mask ? 1 : p.group;
  p.rows_per_head = std::max<int64_t>(8, kTileRowsTarget / p.heads_per_item);
  return p;
}

void run(const Problem& p) {
  // Query tiles never straddle a mask q block, so one item reads one mask row.
  const int64_t block = p.mask ? p.mask->block_q : std::max<int64_t>(p.seq_q, 1);
  const int64_t q_blocks = (p.seq_q + block - 1) / block;
  const int64_t tile = std::min(p.rows_per_head, block);
  const int64_t tiles_per_block = (block + tile - 1) / tile;
  const int64_t groups = p.heads / p.heads_per_item;
  const int64_t items = p.batch * groups * q_blocks * tiles_per_block;
  parallel_for(items, [&](int64_t item) {
    thread_local Workspace ws;
    const int64_t t = item % tiles_per_block, qb = (item / tiles_per_block) % q_blocks;
    const int64_t group = (item / (tiles_per_block * q_blocks)) % groups, b = item / (tiles_per_block * q_blocks * groups);
    const int64_t i0 = qb * block + t * tile;
    const int64_t i1 = std::min({i0 + tile, (qb + 1) * block, p.seq_q});
    if (i0 >= i1) return;
    const int64_t h0 = group * p.heads_per_item;
    // The band of keys any row of the tile may see.
    const int64_t band_lo = key_lo(p, i0), band_end = std::min(p.seq_kv, key_hi(p, i1 - 1) + 1);
    std::vector<KeyRange> ranges;
    if (!p.mask) {
      if (band_lo < band_end) ranges.push_back({band_lo, band_end});
    } else {
      const BlockMaskView& mk = *p.mask;
      const int64_t row = mk.row(b, mk.mask_head_for(h0, p.heads, p.kv_heads), qb);
      for (int32_t n = mk.indptr[row]; n < mk.indptr[row + 1]; ++n) {
        const int64_t begin = std::max(band_lo, mk.indices[n] * mk.block_kv);
        const int64_t end = std::min(band_end, (mk.indices[n] + 1) * mk.block_kv);
        if (begin >= end) continue;
        if (!ranges.empty() && ranges.back().end == begin)
          ranges.back().end = end;  // adjacent kept blocks form one range
        else
          ranges.push_back({begin, end});
      }
    }
    process_item(p, b, h0, i0, i1, ranges, ws);
  });
}

}  // namespace

void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                       const TensorView& lse, const AttentionOptions& options) {
  run(make_problem(q, k, v, out, lse, options, nullptr));
}

void block_sparse_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const BlockMaskView& mask, const TensorView& out, const TensorView& lse,
                                    const AttentionOptions& options) {
  run(make_problem(q, k, v, out, lse, options, &mask));
}

}  // namespace tessel::cpu
