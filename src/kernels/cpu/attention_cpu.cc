// Tiled attention on the CPU (FlashAttention's online softmax, fp32 accumulation).
//
// K and V are first converted to fp32 once, in the layouts of kernels/cpu/tile_kernels.h (K
// transposed in panels of 16 keys), a wave of (batch, kv head) pairs at a time to bound memory.
// Then work is split into items (batch, head group, query tile), run in parallel. A head group is
// the GQA group sharing one kv head (or a single query head when a per-query-head mask gives each
// head its own kv blocks), so each packed K/V chunk is reused by every query row of the group.
// An item walks a list of key ranges: for dense attention the causal/window band of its rows, for
// block-sparse the kept kv blocks of its mask row (clipped to that band). Both share
// process_item(); the token-level causal/window mask is applied only to chunks that straddle the
// band's edge.
#include "cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/convert.h"
#include "cpu/tile_kernels.h"
#include "tessel/core/dtype.h"
#include "tessel/core/parallel.h"

namespace tessel::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Query rows (all heads of a group) per item. Larger tiles reuse each K/V chunk more while it is
// in L2 (512 measured best; docs/perf-log.md, CPU optimization log). Tiles shrink when there would
// be too few items to keep every thread busy.
constexpr int64_t kTileRowsTarget = 512;
// With causal/window limits a tile straddling the band's edge computes masked pairs; smaller
// tiles waste less (128 rows measured faster than 512; docs/perf-log.md).
constexpr int64_t kBandedTileRowsTarget = 128;
constexpr int64_t kMinRowsPerHead = 16;
constexpr size_t kPackBudgetBytes = size_t{256} << 20;  // fp32 K/V packed per wave

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

// Up to kChunkKeys keys from key j0; columns before `first` are outside the visited range.
struct Chunk {
  int64_t j0, n, first;
};

struct Workspace {
  std::vector<float> q, s, o, alpha, row_max, row_sum;
  std::vector<Chunk> chunks;
};

struct KeyRange {
  int64_t begin, end;  // [begin, end)
};

// fp32 K panels and V rows of one (batch, kv head); see tile_kernels.h.
struct PackedKv {
  const float* kt;
  const float* v;
};

int64_t key_panels(const Problem& p) { return (p.seq_kv + kPanelKeys - 1) / kPanelKeys; }
int64_t head_dim_padded(const Problem& p) { return round_up(p.head_dim, 16); }
size_t packed_floats_per_head(const Problem& p) {
  return static_cast<size_t>(2 * key_panels(p) * kPanelKeys * head_dim_padded(p));
}

// Converts keys [16 * panel, 16 * panel + 16) of (b, hk) to fp32: K transposed into its panel, V
// row-major. Padding (keys past S_kv, dims past D) is zero.
void pack_panel(const Problem& p, int64_t b, int64_t hk, int64_t panel, float* kt, float* v) {
  const int64_t dp = head_dim_padded(p);
  thread_local std::vector<float> key_rows;  // the panel's keys in fp32 (row stride dp), before the transpose
  key_rows.resize(static_cast<size_t>(kPanelKeys * dp));
  // Rows of one head are H_kv * D elements apart in BSHD, too far for the hardware prefetcher:
  // request the next panel's rows while converting this one.
  const int64_t row_bytes = p.head_dim * static_cast<int64_t>(dtype_size(p.dtype));
  for (int64_t j = (panel + 1) * kPanelKeys; j < std::min(p.seq_kv, (panel + 2) * kPanelKeys); ++j)
    for (int64_t off = 0; off < row_bytes; off += 64) {
      __builtin_prefetch(p.k.row(b, j, hk) + off);
      __builtin_prefetch(p.v.row(b, j, hk) + off);
    }
  for (int64_t c = 0; c < kPanelKeys; ++c) {
    const int64_t j = panel * kPanelKeys + c;
    float* kr = key_rows.data() + c * dp;
    float* vr = v + j * dp;
    if (j < p.seq_kv) {
      row_to_fp32(p.dtype, p.k.row(b, j, hk), p.head_dim, 1.0f, kr);
      row_to_fp32(p.dtype, p.v.row(b, j, hk), p.head_dim, 1.0f, vr);
      std::fill(kr + p.head_dim, kr + dp, 0.0f);
      std::fill(vr + p.head_dim, vr + dp, 0.0f);
    } else {
      std::fill(kr, kr + dp, 0.0f);
      std::fill(vr, vr + dp, 0.0f);
    }
  }
  pack_key_panel(key_rows.data(), dp, dp, kt + panel * kPanelKeys * dp);
}

// Runs one item: query rows [i0, i1) of heads [h0, h0 + heads_per_item) over the key ranges.
void process_item(const Problem& p, const PackedKv& kv, int64_t b, int64_t h0, int64_t i0, int64_t i1,
                  const std::vector<KeyRange>& ranges, Workspace& ws) {
  const int64_t rows = i1 - i0, heads = p.heads_per_item, m = rows * heads;
  const int64_t dp = head_dim_padded(p), ld_s = kChunkKeys;
  ws.q.resize(static_cast<size_t>(m * dp));
  ws.o.resize(static_cast<size_t>(m * dp));
  ws.s.resize(static_cast<size_t>(m * ld_s));
  ws.alpha.resize(static_cast<size_t>(m));
  ws.row_max.assign(static_cast<size_t>(m), kNegInf);
  ws.row_sum.assign(static_cast<size_t>(m), 0.0f);
  std::fill(ws.o.begin(), ws.o.end(), 0.0f);
  const int64_t q_row_bytes = p.head_dim * static_cast<int64_t>(dtype_size(p.dtype));
  for (int64_t g = 0; g < heads; ++g)
    for (int64_t r = 0; r < rows; ++r) {
      if (r + 8 < rows)  // strided rows: prefetch a few ahead (see pack_panel)
        for (int64_t off = 0; off < q_row_bytes; off += 64) __builtin_prefetch(p.q.row(b, i0 + r + 8, h0 + g) + off);
      float* qr = &ws.q[static_cast<size_t>((g * rows + r) * dp)];
      row_to_fp32(p.dtype, p.q.row(b, i0 + r, h0 + g), p.head_dim, p.scale_log2, qr);
      std::fill(qr + p.head_dim, qr + dp, 0.0f);
    }

  // Chunks start on panel boundaries; columns before a range's first key are masked.
  ws.chunks.clear();
  for (const KeyRange& range : ranges)
    for (int64_t j0 = range.begin / kPanelKeys * kPanelKeys; j0 < range.end; j0 += kChunkKeys)
      ws.chunks.push_back({j0, std::min(range.end - j0, kChunkKeys), std::max<int64_t>(0, range.begin - j0)});
  for (size_t ci = 0; ci < ws.chunks.size(); ++ci) {
    const auto [j0, n, first] = ws.chunks[ci];
    const int64_t cols = round_up(n, kPanelKeys);
    tile_scores(ws.q.data(), m, dp, kv.kt + j0 * dp, cols, ws.s.data(), ld_s);
    // Token-level mask only where the chunk crosses the band edge of some row.
    const bool whole = key_lo(p, i1 - 1) <= j0 + first && j0 + n - 1 <= key_hi(p, i0);
    for (int64_t row = 0; row < m; ++row) {
      float* s = &ws.s[static_cast<size_t>(row * ld_s)];
      if (!whole) {
        const int64_t i = i0 + row % rows;
        const int64_t lo = std::max(first, key_lo(p, i) - j0), hi = key_hi(p, i) - j0;
        for (int64_t c = 0; c < n; ++c)
          if (c < lo || c > hi) s[c] = kNegInf;
      } else {
        for (int64_t c = 0; c < first; ++c) s[c] = kNegInf;
      }
    }
    tile_softmax(ws.s.data(), m, ld_s, n, cols, ws.row_max.data(), ws.row_sum.data(), ws.alpha.data());
    tile_accumulate(ws.s.data(), m, ld_s, first, n, kv.v + j0 * dp, dp, ws.alpha.data(), ws.o.data());
  }

  constexpr float kLn2 = 0.693147180559945309f;
  for (int64_t g = 0; g < heads; ++g)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t row = g * rows + r;
      const float sum = ws.row_sum[static_cast<size_t>(row)];
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // a row with no key gets 0
      row_from_fp32(p.dtype, &ws.o[static_cast<size_t>(row * dp)], p.head_dim, inv,
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
  const bool banded = options.causal || options.window_left >= 0 || options.window_right >= 0;
  p.rows_per_head = std::max<int64_t>(8, (banded ? kBandedTileRowsTarget : kTileRowsTarget) / p.heads_per_item);
  return p;
}

// The key ranges one item visits: its rows' causal/window band, cut to the kept blocks of its mask row.
std::vector<KeyRange> item_ranges(const Problem& p, int64_t b, int64_t h0, int64_t qb, int64_t i0, int64_t i1) {
  const int64_t band_lo = key_lo(p, i0), band_end = std::min(p.seq_kv, key_hi(p, i1 - 1) + 1);
  std::vector<KeyRange> ranges;
  if (!p.mask) {
    if (band_lo < band_end) ranges.push_back({band_lo, band_end});
    return ranges;
  }
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
  return ranges;
}

void run(const Problem& p) {
  // Query tiles never straddle a mask q block, so one item reads one mask row.
  const int64_t block = p.mask ? p.mask->block_q : std::max<int64_t>(p.seq_q, 1);
  const int64_t q_blocks = (p.seq_q + block - 1) / block;
  const int64_t groups = p.batch * p.heads / p.heads_per_item;
  int64_t tile = std::min(p.rows_per_head, block);
  while (tile > kMinRowsPerHead && groups * q_blocks * ((block + tile - 1) / tile) < 4 * max_threads()) tile = (tile + 1) / 2;
  const int64_t tiles_per_block = (block + tile - 1) / tile;
  const int64_t groups_per_kv_head = p.group / p.heads_per_item;
  const int64_t items_per_kv_head = groups_per_kv_head * q_blocks * tiles_per_block;
  const int64_t kv_heads_total = p.batch * p.kv_heads, panels = key_panels(p);
  const size_t per_head = packed_floats_per_head(p);
  const int64_t wave = std::clamp<int64_t>(static_cast<int64_t>(kPackBudgetBytes / std::max<size_t>(1, per_head * 4)), 1,
                                           kv_heads_total);
  // Reused across calls (per calling thread): a fresh buffer would page-fault on every call.
  thread_local std::vector<float> pack;
  pack.resize(std::max(pack.size(), per_head * static_cast<size_t>(wave)));
  const int64_t dp = head_dim_padded(p);
  float* const pack_data = pack.data();  // worker threads must not name `pack`: it is thread_local
  auto packed = [&](int64_t slot) {
    float* base = pack_data + static_cast<size_t>(slot) * per_head;
    return std::pair<float*, float*>{base, base + panels * kPanelKeys * dp};
  };
  for (int64_t first = 0; first < kv_heads_total; first += wave) {
    const int64_t count = std::min(wave, kv_heads_total - first);
    // A few consecutive panels per task keep each thread on one stream of keys.
    constexpr int64_t kPanelsPerTask = 8;
    const int64_t tasks_per_head = (panels + kPanelsPerTask - 1) / kPanelsPerTask;
    parallel_for(count * tasks_per_head, [&](int64_t task) {
      const int64_t slot = task / tasks_per_head, bh = first + slot;
      const auto [kt, v] = packed(slot);
      const int64_t begin = task % tasks_per_head * kPanelsPerTask;
      for (int64_t panel = begin; panel < std::min(panels, begin + kPanelsPerTask); ++panel)
        pack_panel(p, bh / p.kv_heads, bh % p.kv_heads, panel, kt, v);
    });
    parallel_for(count * items_per_kv_head, [&](int64_t item) {
      thread_local Workspace ws;
      const int64_t slot = item / items_per_kv_head, bh = first + slot, b = bh / p.kv_heads, hk = bh % p.kv_heads;
      const int64_t local = item % items_per_kv_head;
      const int64_t t = local % tiles_per_block, qb = (local / tiles_per_block) % q_blocks;
      const int64_t gi = local / (tiles_per_block * q_blocks);
      const int64_t i0 = qb * block + t * tile;
      const int64_t i1 = std::min({i0 + tile, (qb + 1) * block, p.seq_q});
      if (i0 >= i1) return;
      const int64_t h0 = hk * p.group + gi * p.heads_per_item;
      const auto [kt, v] = packed(slot);
      process_item(p, {kt, v}, b, h0, i0, i1, item_ranges(p, b, h0, qb, i0, i1), ws);
    });
  }
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
