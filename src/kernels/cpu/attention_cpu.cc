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
//
// All scratch (the packed K/V wave and each thread's tiles, chunk and range lists) is taken from
// the context's workspace, sized by cpu_attention_workspace_bytes(); nothing is allocated per call
// when the caller reserved it.
#include "cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/convert.h"
#include "cpu/tile_kernels.h"
#include "tessel/core/dtype.h"
#include "tessel/core/error.h"
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

struct KeyRange {
  int64_t begin, end;  // [begin, end)
};

// A worker thread's scratch, carved from the workspace; capacities are the upper bounds below.
struct ThreadScratch {
  float *q, *o, *s, *alpha, *row_max, *row_sum;
  float* key_rows;  // one panel's keys in fp32 (row stride dp), before the transpose
  Chunk* chunks;
  KeyRange* ranges;
};

// Upper bounds of one item, whatever the mask (per-query-head or not) and causal/window options.
struct ScratchBounds {
  int64_t item_rows;  // query rows of all heads of one item (m)
  int64_t dp;         // head dim padded to 16
  int64_t ranges;     // key ranges of one item
  int64_t chunks;     // key chunks of one item
};

int64_t round_up_16(int64_t x) { return (x + 15) / 16 * 16; }

ScratchBounds scratch_bounds(int64_t seq_kv, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t mask_block_kv) {
  const int64_t group = heads / kv_heads;
  // An item holds heads_per_item (1 or group) heads of at most rows_per_head rows (make_problem;
  // the banded target is the smaller one).
  const auto item_rows = [](int64_t heads_per_item) {
    return heads_per_item * std::max<int64_t>(8, kTileRowsTarget / heads_per_item);
  };
  ScratchBounds b{};
  b.item_rows = std::max(item_rows(1), item_rows(group));
  b.dp = round_up_16(head_dim);
  b.ranges = mask_block_kv > 0 ? std::max<int64_t>(1, (seq_kv + mask_block_kv - 1) / mask_block_kv) : 1;
  // A range [begin, end) is cut into chunks from begin rounded down to a panel.
  b.chunks = seq_kv / kChunkKeys + 2 * b.ranges + 1;
  return b;
}

// The q, output and score tiles are large powers of two: laid out back to back they would start
// in the same cache sets and evict each other. A gap of a few cache lines after each staggers them.
constexpr size_t kTileStagger = 5 * kWorkspaceAlignment;

size_t thread_scratch_bytes(const ScratchBounds& b) {
  const auto floats = [](int64_t n) { return workspace_slice_bytes(static_cast<size_t>(n) * sizeof(float)); };
  return 2 * floats(b.item_rows * b.dp) + floats(b.item_rows * kChunkKeys) + 3 * kTileStagger + 3 * floats(b.item_rows) +
         floats(kPanelKeys * b.dp) + workspace_slice_bytes(static_cast<size_t>(b.chunks) * sizeof(Chunk)) +
         workspace_slice_bytes(static_cast<size_t>(b.ranges) * sizeof(KeyRange));
}

ThreadScratch take_thread_scratch(WorkspaceSlicer& slicer, const ScratchBounds& b) {
  ThreadScratch t{};
  t.q = slicer.take<float>(static_cast<size_t>(b.item_rows * b.dp), "attention q tile");
  slicer.take_bytes(kTileStagger, "attention tile stagger");
  t.o = slicer.take<float>(static_cast<size_t>(b.item_rows * b.dp), "attention output tile");
  slicer.take_bytes(kTileStagger, "attention tile stagger");
  t.s = slicer.take<float>(static_cast<size_t>(b.item_rows * kChunkKeys), "attention score tile");
  slicer.take_bytes(kTileStagger, "attention tile stagger");
  t.alpha = slicer.take<float>(static_cast<size_t>(b.item_rows), "attention rescale factors");
  t.row_max = slicer.take<float>(static_cast<size_t>(b.item_rows), "attention row maxima");
  t.row_sum = slicer.take<float>(static_cast<size_t>(b.item_rows), "attention row sums");
  t.key_rows = slicer.take<float>(static_cast<size_t>(kPanelKeys * b.dp), "attention key panel");
  t.chunks = slicer.take<Chunk>(static_cast<size_t>(b.chunks), "attention key chunks");
  t.ranges = slicer.take<KeyRange>(static_cast<size_t>(b.ranges), "attention key ranges");
  return t;
}

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
void pack_panel(const Problem& p, int64_t b, int64_t hk, int64_t panel, float* kt, float* v, float* key_rows) {
  const int64_t dp = head_dim_padded(p);
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
    float* kr = key_rows + c * dp;
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
  pack_key_panel(key_rows, dp, dp, kt + panel * kPanelKeys * dp);
}

// Sets to -inf the scores of the pairs that the mask's sub-block bits drop, for the chunk's
// visited columns [first, n) of query rows [i0, i0 + rows) of each head of the item (the scores of
// m = rows * heads rows, row stride ld_s). The item's rows lie in one q block, so they read one
// mask row; the visited keys lie in kept blocks of that row.
void apply_sub_block_bits(const Problem& p, int64_t b, int64_t h0, int64_t i0, int64_t rows, int64_t m,
                          const Chunk& chunk, float* scores, int64_t ld_s) {
  const BlockMaskView& mk = *p.mask;
  const int64_t qb = i0 / mk.block_q, words = mk.sub_block_words();
  const int64_t row = mk.row(b, mk.mask_head_for(h0, p.heads, p.kv_heads), qb);
  const int32_t* kept_begin = mk.indices + mk.indptr[row];
  const int32_t* kept_end = mk.indices + mk.indptr[row + 1];
  const int64_t key_begin = chunk.j0 + chunk.first, key_end = chunk.j0 + chunk.n;
  for (int64_t block = key_begin / mk.block_kv; block * mk.block_kv < key_end; ++block) {
    const int32_t* found = std::lower_bound(kept_begin, kept_end, static_cast<int32_t>(block));
    const bool kept = found != kept_end && *found == block;
    const int64_t position = found - mk.indices;  // the block's index in the whole CSR
    const int64_t c_lo = std::max(key_begin, block * mk.block_kv) - chunk.j0;
    const int64_t c_hi = std::min(key_end, (block + 1) * mk.block_kv) - chunk.j0;
    const int64_t key_offset = chunk.j0 - block * mk.block_kv;  // column c is key c + key_offset of the block
    for (int64_t r = 0; r < m; ++r) {
      float* s = scores + r * ld_s;
      const int64_t in_block = i0 + r % rows - qb * mk.block_q;
      const uint32_t* bits = mk.sub_block_bits + (position * mk.block_q + in_block) * words;
      for (int64_t c = c_lo; c < c_hi; ++c) {
        const int64_t key = c + key_offset;
        if (!kept || ((bits[key >> 5] >> (key & 31)) & 1u) == 0) s[c] = kNegInf;
      }
    }
  }
}

// Runs one item: query rows [i0, i1) of heads [h0, h0 + heads_per_item) over the key ranges.
void process_item(const Problem& p, const PackedKv& kv, int64_t b, int64_t h0, int64_t i0, int64_t i1,
                  const KeyRange* ranges, int64_t num_ranges, const ThreadScratch& ws) {
  const int64_t rows = i1 - i0, heads = p.heads_per_item, m = rows * heads;
  const int64_t dp = head_dim_padded(p), ld_s = kChunkKeys;
  std::fill(ws.row_max, ws.row_max + m, kNegInf);
  std::fill(ws.row_sum, ws.row_sum + m, 0.0f);
  std::fill(ws.o, ws.o + m * dp, 0.0f);
  const int64_t q_row_bytes = p.head_dim * static_cast<int64_t>(dtype_size(p.dtype));
  for (int64_t g = 0; g < heads; ++g)
    for (int64_t r = 0; r < rows; ++r) {
      if (r + 8 < rows)  // strided rows: prefetch a few ahead (see pack_panel)
        for (int64_t off = 0; off < q_row_bytes; off += 64) __builtin_prefetch(p.q.row(b, i0 + r + 8, h0 + g) + off);
      float* qr = ws.q + (g * rows + r) * dp;
      row_to_fp32(p.dtype, p.q.row(b, i0 + r, h0 + g), p.head_dim, p.scale_log2, qr);
      std::fill(qr + p.head_dim, qr + dp, 0.0f);
    }

  // Chunks start on panel boundaries; columns before a range's first key are masked.
  int64_t num_chunks = 0;
  for (int64_t r = 0; r < num_ranges; ++r) {
    const KeyRange& range = ranges[r];
    for (int64_t j0 = range.begin / kPanelKeys * kPanelKeys; j0 < range.end; j0 += kChunkKeys)
      ws.chunks[num_chunks++] = {j0, std::min(range.end - j0, kChunkKeys), std::max<int64_t>(0, range.begin - j0)};
  }
  for (int64_t ci = 0; ci < num_chunks; ++ci) {
    const auto [j0, n, first] = ws.chunks[ci];
    const int64_t cols = round_up(n, kPanelKeys);
    tile_scores(ws.q, m, dp, kv.kt + j0 * dp, cols, ws.s, ld_s);
    // Token-level mask only where the chunk crosses the band edge of some row.
    const bool whole = key_lo(p, i1 - 1) <= j0 + first && j0 + n - 1 <= key_hi(p, i0);
    for (int64_t row = 0; row < m; ++row) {
      float* s = ws.s + row * ld_s;
      if (!whole) {
        const int64_t i = i0 + row % rows;
        const int64_t lo = std::max(first, key_lo(p, i) - j0), hi = key_hi(p, i) - j0;
        for (int64_t c = 0; c < n; ++c)
          if (c < lo || c > hi) s[c] = kNegInf;
      } else {
        for (int64_t c = 0; c < first; ++c) s[c] = kNegInf;
      }
    }
    if (p.mask && p.mask->sub_block_bits) apply_sub_block_bits(p, b, h0, i0, rows, m, ws.chunks[ci], ws.s, ld_s);
    tile_softmax(ws.s, m, ld_s, n, cols, ws.row_max, ws.row_sum, ws.alpha);
    tile_accumulate(ws.s, m, ld_s, first, n, kv.v + j0 * dp, dp, ws.alpha, ws.o);
  }

  constexpr float kLn2 = 0.693147180559945309f;
  for (int64_t g = 0; g < heads; ++g)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t row = g * rows + r;
      const float sum = ws.row_sum[row];
      // A row with no key gets 0 and LSE -inf; a NaN (from a NaN in q or k) stays NaN, as in
      // FlashAttention and the CUDA kernels.
      const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
      row_from_fp32(p.dtype, ws.o + row * dp, p.head_dim, inv,
                    const_cast<char*>(p.out.row(b, i0 + r, h0 + g)));
      if (p.lse)
        p.lse[((b * p.heads) + h0 + g) * p.seq_q + i0 + r] =
            sum == 0.0f ? kNegInf : (ws.row_max[row] + std::log2(sum)) * kLn2;
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

// The key ranges one item visits: its rows' causal/window band, cut to the kept blocks of its mask
// row. Writes them to `ranges` (room for the kv blocks of a row) and returns how many.
int64_t item_ranges(const Problem& p, int64_t b, int64_t h0, int64_t qb, int64_t i0, int64_t i1, KeyRange* ranges) {
  const int64_t band_lo = key_lo(p, i0), band_end = std::min(p.seq_kv, key_hi(p, i1 - 1) + 1);
  int64_t count = 0;
  if (!p.mask) {
    if (band_lo < band_end) ranges[count++] = {band_lo, band_end};
    return count;
  }
  const BlockMaskView& mk = *p.mask;
  const int64_t row = mk.row(b, mk.mask_head_for(h0, p.heads, p.kv_heads), qb);
  for (int32_t n = mk.indptr[row]; n < mk.indptr[row + 1]; ++n) {
    const int64_t begin = std::max(band_lo, mk.indices[n] * mk.block_kv);
    const int64_t end = std::min(band_end, (mk.indices[n] + 1) * mk.block_kv);
    if (begin >= end) continue;
    if (count > 0 && ranges[count - 1].end == begin)
      ranges[count - 1].end = end;  // adjacent kept blocks form one range
    else
      ranges[count++] = {begin, end};
  }
  return count;
}

// (batch, kv head) pairs packed at once: as many as fit kPackBudgetBytes, at least one.
int64_t pack_wave(const Problem& p) {
  const size_t per_head = packed_floats_per_head(p);
  return std::clamp<int64_t>(static_cast<int64_t>(kPackBudgetBytes / std::max<size_t>(1, per_head * 4)), 1,
                             p.batch * p.kv_heads);
}

void run(const ExecContext& ctx, const Problem& p, const Workspace& workspace) {
  const int threads = ctx.threads();
  // Query tiles never straddle a mask q block, so one item reads one mask row.
  const int64_t block = p.mask ? p.mask->block_q : std::max<int64_t>(p.seq_q, 1);
  const int64_t q_blocks = (p.seq_q + block - 1) / block;
  const int64_t groups = p.batch * p.heads / p.heads_per_item;
  int64_t tile = std::min(p.rows_per_head, block);
  while (tile > kMinRowsPerHead && groups * q_blocks * ((block + tile - 1) / tile) < 4 * threads) tile = (tile + 1) / 2;
  const int64_t tiles_per_block = (block + tile - 1) / tile;
  const int64_t groups_per_kv_head = p.group / p.heads_per_item;
  const int64_t items_per_kv_head = groups_per_kv_head * q_blocks * tiles_per_block;
  const int64_t kv_heads_total = p.batch * p.kv_heads, panels = key_panels(p);
  const size_t per_head = packed_floats_per_head(p);
  const int64_t wave = pack_wave(p);
  const int64_t dp = head_dim_padded(p);
  WorkspaceSlicer slicer(workspace);
  float* const pack_data = slicer.take<float>(per_head * static_cast<size_t>(wave), "attention packed K/V");
  const ScratchBounds bounds = scratch_bounds(p.seq_kv, p.heads, p.kv_heads, p.head_dim, p.mask ? p.mask->block_kv : 0);
  ThreadScratch* const scratch = slicer.take<ThreadScratch>(static_cast<size_t>(threads), "attention thread table");
  for (int t = 0; t < threads; ++t) scratch[t] = take_thread_scratch(slicer, bounds);
  auto packed = [&](int64_t slot) {
    float* base = pack_data + static_cast<size_t>(slot) * per_head;
    return std::pair<float*, float*>{base, base + panels * kPanelKeys * dp};
  };
  for (int64_t first = 0; first < kv_heads_total; first += wave) {
    const int64_t count = std::min(wave, kv_heads_total - first);
    // A few consecutive panels per task keep each thread on one stream of keys.
    constexpr int64_t kPanelsPerTask = 8;
    const int64_t tasks_per_head = (panels + kPanelsPerTask - 1) / kPanelsPerTask;
    parallel_for(threads, count * tasks_per_head, [&](int64_t task, int thread) {
      const int64_t slot = task / tasks_per_head, bh = first + slot;
      const auto [kt, v] = packed(slot);
      const int64_t begin = task % tasks_per_head * kPanelsPerTask;
      for (int64_t panel = begin; panel < std::min(panels, begin + kPanelsPerTask); ++panel)
        pack_panel(p, bh / p.kv_heads, bh % p.kv_heads, panel, kt, v, scratch[thread].key_rows);
    });
    parallel_for(threads, count * items_per_kv_head, [&](int64_t item, int thread) {
      const ThreadScratch& ws = scratch[thread];
      const int64_t slot = item / items_per_kv_head, bh = first + slot, b = bh / p.kv_heads, hk = bh % p.kv_heads;
      const int64_t local = item % items_per_kv_head;
      const int64_t t = local % tiles_per_block, qb = (local / tiles_per_block) % q_blocks;
      const int64_t gi = local / (tiles_per_block * q_blocks);
      const int64_t i0 = qb * block + t * tile;
      const int64_t i1 = std::min({i0 + tile, (qb + 1) * block, p.seq_q});
      if (i0 >= i1) return;
      const int64_t h0 = hk * p.group + gi * p.heads_per_item;
      const auto [kt, v] = packed(slot);
      const int64_t num_ranges = item_ranges(p, b, h0, qb, i0, i1, ws.ranges);
      process_item(p, {kt, v}, b, h0, i0, i1, ws.ranges, num_ranges, ws);
    });
  }
}

// Runs with the context's workspace, or (without one) with a workspace of this call's own.
void run_with_workspace(const ExecContext& ctx, const Problem& p) {
  if (ctx.workspace != nullptr) {
    if (!ctx.workspace->device().is_cpu())
      fail_argument("ctx.workspace", "host memory for CPU attention", ctx.workspace->device().str());
    return run(ctx, p, *ctx.workspace);
  }
  Workspace local;
  local.reserve(workspace_bytes(ctx.threads(), p.batch, p.seq_kv, p.heads, p.kv_heads, p.head_dim,
                                p.mask ? p.mask->block_kv : 0));
  run(ctx, p, local);
}

}  // namespace

size_t workspace_bytes(int threads, int64_t batch, int64_t seq_kv, int64_t heads, int64_t kv_heads, int64_t head_dim,
                       int64_t mask_block_kv) {
  Problem p{};
  p.batch = batch;
  p.seq_kv = seq_kv;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  const ScratchBounds bounds = scratch_bounds(seq_kv, heads, kv_heads, head_dim, mask_block_kv);
  const size_t per_thread = thread_scratch_bytes(bounds);
  const size_t count = static_cast<size_t>(std::max(threads, 1));
  return workspace_slice_bytes(packed_floats_per_head(p) * static_cast<size_t>(pack_wave(p)) * sizeof(float)) +
         workspace_slice_bytes(count * sizeof(ThreadScratch)) + count * per_thread;
}

void attention_forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView& lse, const AttentionOptions& options) {
  run_with_workspace(ctx, make_problem(q, k, v, out, lse, options, nullptr));
}

void block_sparse_attention_forward(const ExecContext& ctx, const TensorView& q, const TensorView& k,
                                    const TensorView& v, const BlockMaskView& mask, const TensorView& out,
                                    const TensorView& lse, const AttentionOptions& options) {
  run_with_workspace(ctx, make_problem(q, k, v, out, lse, options, &mask));
}

}  // namespace tessel::cpu
