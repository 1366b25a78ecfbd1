// Warp-specialized Hopper forward kernel (sm_90a) for dense and block-sparse attention, D = 64 or 128.
//
// A persistent grid (one CTA per SM) walks work items of 128 query rows of one (batch, head); each
// CTA has three warpgroups:
//  - warpgroup 0, the producer, gives up registers (setmaxnreg) and one of its threads issues
//    bulk tensor copies (TMA): K and V tiles of 128 keys into a ring of kStages shared-memory
//    stages, each guarded by a "full" and an "empty" mbarrier, and per item Q (after the item's
//    first stage, once the consumers hand Q's buffer back). The ring runs on across items, so
//    the next item's first stage loads while the current item finishes;
//  - warpgroups 1 and 2, the consumers, take the registers and own 64 query rows each: per stage
//    S = Q K^T (wgmma, both operands in shared memory), the online softmax in registers, then
//    O += P V (wgmma with P from registers and V read transposed from shared memory).
// A stage holds two 64-key sub-tiles, each at its own key offset: for dense attention they are
// adjacent, for a block mask they are the next two 64-key pieces of the row's kept blocks, so one
// kernel serves both. The producer writes each stage's two offsets next to the barriers; an
// offset of -1 marks a missing second sub-tile (its columns are masked), and a stage whose first
// offset is -1 tells the consumers that the row has no more tiles.
//
// Shared tiles are what the copy engine writes with the 128-byte swizzle: boxes of 64 rows x 64
// columns (128 bytes a row), 8-row groups 1024 bytes apart, which wgmma reads K-major (Q, K) or
// MN-major (V). A D-column operand is D / 64 such column halves, kHalfBytes apart.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/flash_forward_kernel.cuh"
#include "cuda/flash_params.h"
#include "cuda/hopper/async_copy.cuh"
#include "cuda/wgmma.cuh"

namespace tessel::cuda::detail {

namespace hopper {

inline constexpr int kBlockM = 128;    // query rows per CTA (64 per consumer warpgroup)
inline constexpr int kBlockN = 128;    // keys per stage (two sub-tiles of 64)
inline constexpr int kSubTile = 64;
inline constexpr int kStages = 3;
inline constexpr int kThreads = 384;   // producer warpgroup + two consumer warpgroups
inline constexpr int kConsumerThreads = 256;
inline constexpr int kProducerRegisters = 40;
inline constexpr int kConsumerRegisters = 232;

// Kept block ids of a mask row staged in shared memory (the rest are read from global memory):
// what fits beside three stages.
inline constexpr int kIndexCacheEntries = 256;

// A 64-column half of a 128-row operand (128 rows x 128 bytes); a box is 64 rows of it.
inline constexpr uint32_t kHalfBytes = 128 * 128;
inline constexpr uint32_t kBoxBytes = 64 * 128;

// Shared memory for head dim D, from a 1024-byte aligned base: Q, the K stages, the V stages, then
// the barriers, the stages' key offsets and the cache of a mask row's kept block ids.
template <int D>
struct SharedLayout {
  static constexpr uint32_t kTileBytes = D / 64 * kHalfBytes;  // 128 rows x D columns of 16-bit values
  static constexpr uint32_t q = 0;
  static constexpr uint32_t k = q + kTileBytes;
  static constexpr uint32_t v = k + kStages * kTileBytes;
  static constexpr uint32_t q_full = v + kStages * kTileBytes;
  static constexpr uint32_t q_empty = q_full + 8;
  static constexpr uint32_t full = q_empty + 8;
  static constexpr uint32_t empty = full + 8 * kStages;
  static constexpr uint32_t offsets = empty + 8 * kStages;  // int32 [kStages][2]
  static constexpr uint32_t index_cache = offsets + 8 * kStages;
  static constexpr uint32_t bytes(bool sparse) { return index_cache + (sparse ? kIndexCacheEntries * 4 : 0); }
};

}  // namespace hopper

template <typename T, int D, bool kSparse>
__global__ void __launch_bounds__(hopper::kThreads, 1)
    flash_forward_hopper_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                const __grid_constant__ CUtensorMap v_map, const FlashParams p, int batch_count) {
#if TESSEL_WGMMA_AVAILABLE
  using namespace hopper;
  using Operands = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, Bf16Operands, F16Operands>;
  using SharedLayout = hopper::SharedLayout<D>;
  constexpr uint32_t kTileBytes = SharedLayout::kTileBytes;
  constexpr int kHalves = D / 64;
  constexpr int kOutTiles = D / 8;  // n8 tiles of an O row slab
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // The swizzled boxes need a 1024-byte aligned base; the launch adds that much slack.
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw + 1023) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t s_q = base + SharedLayout::q;
  const uint32_t s_k = base + SharedLayout::k;
  const uint32_t s_v = base + SharedLayout::v;
  const uint32_t bar_q = base + SharedLayout::q_full;
  const uint32_t bar_q_empty = base + SharedLayout::q_empty;
  const uint32_t bar_full = base + SharedLayout::full;
  const uint32_t bar_empty = base + SharedLayout::empty;
  volatile int32_t* stage_offsets = reinterpret_cast<volatile int32_t*>(smem + SharedLayout::offsets);

  const int tid = threadIdx.x;
  const int warpgroup = tid / 128;
  // CTA c takes items c, c + gridDim.x, ...: query blocks fastest, in descending order (causal:
  // the longest rows first), so CTAs that run together read the K/V of few heads (L2).
  const int q_blocks = (p.seq_q + kBlockM - 1) / kBlockM;
  const int items = q_blocks * p.heads_q * batch_count;
  struct Item {
    int m0, head, batch;
  };
  auto item_at = [&](int item) {
    return Item{(q_blocks - 1 - item % q_blocks) * kBlockM, (item / q_blocks) % p.heads_q, item / (q_blocks * p.heads_q)};
  };

  if (tid == 0) {
    mbarrier_init(bar_q, 1);
    mbarrier_init(bar_q_empty, kConsumerThreads);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(bar_full + 8 * s, 1);
      mbarrier_init(bar_empty + 8 * s, kConsumerThreads);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (tid >= 32) return;
    if (tid == 0) {
      prefetch_tensor_map(&q_map);
      prefetch_tensor_map(&k_map);
      prefetch_tensor_map(&v_map);
    }
    int iteration = 0;
    int local = 0;
    for (int item = blockIdx.x; item < items; item += gridDim.x, ++local) {
      const Item w = item_at(item);
      const int kv_head = w.head / p.group;
      // The visible key range of the item's rows and its list of 64-key tiles; the warp stages a
      // mask row's block ids once thread 0 is done with the previous item's.
      TileWalk<kSparse> walk = make_tile_walk<kSparse>(p, w.batch, w.head, w.m0, min(w.m0 + kBlockM, p.seq_q) - 1);
      if constexpr (kSparse) {
        int32_t* cache = reinterpret_cast<int32_t*>(smem + SharedLayout::index_cache);
        walk.cached_count = min(walk.row_blocks, kIndexCacheEntries);
        __syncwarp();
        for (int i = tid; i < walk.cached_count; i += 32) cache[i] = walk.row_indices[i];
        walk.cached = cache;
        __syncwarp();
      }
      if (tid != 0) continue;

      // Q once the consumers have issued their last product with the previous item's. It is
      // loaded after the item's first K/V stage is on its way (that stage's slot is usually free
      // well before the consumers finish the previous item), so the switch waits for Q alone.
      bool q_loaded = false;
      auto load_q = [&] {
        mbarrier_wait(bar_q_empty, (local & 1) ^ 1);
        mbarrier_arrive_expect_tx(bar_q, kTileBytes);
        for (int half = 0; half < kHalves; ++half)
          for (int rows = 0; rows < 2; ++rows)
            tma_load_4d(s_q + half * kHalfBytes + rows * kBoxBytes, &q_map, bar_q, half * 64, w.m0 + rows * 64, w.head,
                        w.batch);
        // The next item's Q waits for this item's last QK^T: have it in L2 by then.
        if (item + static_cast<int>(gridDim.x) < items) {
          const Item next = item_at(item + gridDim.x);
          for (int half = 0; half < kHalves; ++half)
            for (int rows = 0; rows < 2; ++rows)
              tma_prefetch_l2_4d(&q_map, half * 64, next.m0 + rows * 64, next.head, next.batch);
        }
        q_loaded = true;
      };

      int tile = walk.next(0);
      const int end = walk.end();
      for (;; ++iteration) {
        const int stage = iteration % kStages;
        const uint32_t phase = (iteration / kStages) & 1;
        mbarrier_wait(bar_empty + 8 * stage, phase ^ 1);
        if (tile >= end) {
          // No more tiles: a stage with no bytes and offset -1 ends the item for the consumers.
          stage_offsets[2 * stage] = -1;
          stage_offsets[2 * stage + 1] = -1;
          mbarrier_arrive(bar_full + 8 * stage);
          ++iteration;
          break;
        }
        const int n0 = walk.tile_start(tile);
        const int second = walk.next(tile + 1);
        const int n1 = second < end ? walk.tile_start(second) : -1;
        tile = second < end ? walk.next(second + 1) : end;
        stage_offsets[2 * stage] = n0;
        stage_offsets[2 * stage + 1] = n1;
        const uint32_t bar = bar_full + 8 * stage;
        mbarrier_arrive_expect_tx(bar, 2 * kTileBytes);
        const uint32_t k_stage = s_k + stage * kTileBytes, v_stage = s_v + stage * kTileBytes;
        // A missing second sub-tile reloads the first: finite values under masked columns.
        const int keys1 = n1 >= 0 ? n1 : n0;
        for (int half = 0; half < kHalves; ++half) {
          tma_load_4d(k_stage + half * kHalfBytes, &k_map, bar, half * 64, n0, kv_head, w.batch);
          tma_load_4d(k_stage + half * kHalfBytes + kBoxBytes, &k_map, bar, half * 64, keys1, kv_head, w.batch);
          tma_load_4d(v_stage + half * kHalfBytes, &v_map, bar, half * 64, n0, kv_head, w.batch);
          tma_load_4d(v_stage + half * kHalfBytes + kBoxBytes, &v_map, bar, half * 64, keys1, kv_head, w.batch);
        }
        if (!q_loaded) load_q();
      }
      if (!q_loaded) load_q();  // an item with no tiles: the consumers still wait for its Q
    }
    return;
  }

  // Consumers.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
  const int consumer = warpgroup - 1;  // which 64 rows
  const int ctid = tid - 128 * warpgroup;
  const int warp = ctid >> 5, lane = ctid & 31;
  const int group = lane >> 2, quad = lane & 3;
  // The current item's rows: [wg_row0, wg_row0 + 63] for this warpgroup; keys in
  // [all_rows_lo, all_rows_hi] are visible to all of them (tiles inside need no mask).
  int wg_row0 = 0, all_rows_lo = 0, all_rows_hi = 0;

  float o_acc[D / 2];
  float s_acc[64];
  uint32_t p_frag[8][4];
  float row_max[2];
  float row_sum[2];

  const uint64_t q_desc = wgmma_desc_k_major_sw128(s_q + consumer * kBoxBytes);
  // S = Q K^T of a stage: 8 k16 slices, 4 per column half of Q and K; committed, not waited for.
  auto issue_scores = [&](int stage) {
    const uint64_t k_desc = wgmma_desc_k_major_sw128(s_k + stage * kTileBytes);
    wgmma_fence_operands(s_acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint64_t step = (kk >> 2) * (kHalfBytes >> 4) + (kk & 3) * 2;
      wgmma_m64n128k16(s_acc, q_desc + step, k_desc + step, kk > 0, Operands{});
    }
    wgmma_commit();
  };
  // O += P V of a stage: 8 k16 slices of keys, V read MN-major (column halves kHalfBytes apart).
  auto issue_values = [&](int stage) {
    const uint64_t v_desc = wgmma_desc_mn_major_sw128(s_v + stage * kTileBytes, kHalfBytes);
    wgmma_fence_operands(o_acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      wgmma_rs_trans_b(o_acc, p_frag[kk], v_desc + kk * (16 * 128 >> 4), Operands{});
    wgmma_commit();
  };
  // Masks S where a sub-tile is missing or crosses the sequence end or a causal/window edge, then
  // turns it into unnormalized probabilities against the new running max; returns each row's
  // rescale factor for O. s_acc[4j + 2h + e] is row group + 8h, column 8j + 2 quad + e.
  auto softmax = [&](int n0, int n1, float (&alpha)[2]) {
    const bool mask0 = n0 + kSubTile - 1 > all_rows_hi || n0 < all_rows_lo;
    const bool mask1 = n1 < 0 || n1 + kSubTile - 1 > all_rows_hi || n1 < all_rows_lo;
    if (mask0 || mask1) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = wg_row0 + warp * 16 + group + 8 * h;
        const int hi = p.has_hi ? min(p.seq_kv - 1, i + p.hi_offset) : p.seq_kv - 1;
        const int lo = p.has_lo ? i + p.lo_offset : -kNoLimit;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const int start = j < 8 ? n0 : n1;
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = start + (j & 7) * 8 + 2 * quad + e;
            if (start < 0 || key > hi || key < lo) s_acc[4 * j + 2 * h + e] = -INFINITY;
          }
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = row_max[h];
#pragma unroll
      for (int j = 0; j < 16; ++j) mx = fmaxf(mx, fmaxf(s_acc[4 * j + 2 * h], s_acc[4 * j + 2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float shift = mx == -INFINITY ? 0.f : mx * p.scale_log2;
      alpha[h] = mx == row_max[h] ? 1.f : fast_exp2(row_max[h] * p.scale_log2 - shift);
      row_max[h] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float p0 = fast_exp2(s_acc[4 * j + 2 * h] * p.scale_log2 - shift);
        const float p1 = fast_exp2(s_acc[4 * j + 2 * h + 1] * p.scale_log2 - shift);
        s_acc[4 * j + 2 * h] = p0;
        s_acc[4 * j + 2 * h + 1] = p1;
        sum += p0 + p1;
      }
      row_sum[h] = row_sum[h] * alpha[h] + sum;
    }
  };
  // Columns 16kk..16kk+15 are n8 tiles 2kk and 2kk+1: the m16n8k16 A layout.
  auto pack_probabilities = [&] {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      p_frag[kk][0] = MmaType<T>::pack(s_acc[8 * kk + 0], s_acc[8 * kk + 1]);
      p_frag[kk][1] = MmaType<T>::pack(s_acc[8 * kk + 2], s_acc[8 * kk + 3]);
      p_frag[kk][2] = MmaType<T>::pack(s_acc[8 * kk + 4], s_acc[8 * kk + 5]);
      p_frag[kk][3] = MmaType<T>::pack(s_acc[8 * kk + 6], s_acc[8 * kk + 7]);
    }
  };
  auto wait_stage = [&](int iteration, int& n0, int& n1) {
    const int stage = iteration % kStages;
    mbarrier_wait(bar_full + 8 * stage, (iteration / kStages) & 1);
    n0 = stage_offsets[2 * stage];
    n1 = stage_offsets[2 * stage + 1];
  };

  // Software pipeline inside the warpgroup: the scores of stage j+1 and the PV product of stage j
  // are issued together; the softmax of j+1 runs while the PV product is on the tensor cores.
  int iteration = 0;
  int local = 0;
  for (int item = blockIdx.x; item < items; item += gridDim.x, ++local) {
    const Item w = item_at(item);
    wg_row0 = w.m0 + 64 * consumer;
    const int wg_row_last = min(wg_row0 + 63, p.seq_q - 1);
    all_rows_lo = p.has_lo ? wg_row_last + p.lo_offset : -kNoLimit;
    all_rows_hi = p.has_hi ? min(p.seq_kv - 1, wg_row0 + p.hi_offset) : p.seq_kv - 1;
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o_acc[i] = 0.f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;

    mbarrier_wait(bar_q, local & 1);
    int n0 = 0, n1 = 0;
    wait_stage(iteration, n0, n1);
    if (n0 >= 0) {
      issue_scores(iteration % kStages);
      wgmma_wait<0>();
      wgmma_fence_operands(s_acc);
      float alpha[2];
      softmax(n0, n1, alpha);  // O is still zero: nothing to rescale
      pack_probabilities();
      int held = iteration % kStages;  // the stage whose V the pending PV product reads
      for (;;) {
        wait_stage(++iteration, n0, n1);
        if (n0 < 0) break;
        const int stage = iteration % kStages;
        issue_scores(stage);
        issue_values(held);
        wgmma_wait<1>();
        wgmma_fence_operands(s_acc);
        softmax(n0, n1, alpha);
        wgmma_wait<0>();
        wgmma_fence_operands(o_acc);
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) wgmma_fence_operands(p_frag[kk]);
        mbarrier_arrive(bar_empty + 8 * held);
#pragma unroll
        for (int j = 0; j < kOutTiles; ++j) {
          o_acc[4 * j] *= alpha[0];
          o_acc[4 * j + 1] *= alpha[0];
          o_acc[4 * j + 2] *= alpha[1];
          o_acc[4 * j + 3] *= alpha[1];
        }
        pack_probabilities();
        held = stage;
      }
      // Every product with Q is done: the producer may load the next item's.
      mbarrier_arrive(bar_q_empty);
      mbarrier_arrive(bar_empty + 8 * (iteration % kStages));  // the end-of-item stage
      issue_values(held);
      wgmma_wait<0>();
      wgmma_fence_operands(o_acc);
      mbarrier_arrive(bar_empty + 8 * held);
    } else {
      mbarrier_arrive(bar_q_empty);
      mbarrier_arrive(bar_empty + 8 * (iteration % kStages));
    }
    ++iteration;  // past the end-of-item stage

    // Epilogue: row sums across the quad, LSE, normalized O stored from registers.
    T* out = static_cast<T*>(p.out) + w.batch * p.o_stride_b + w.head * p.o_stride_h;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum[h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      const int i = wg_row0 + warp * 16 + group + 8 * h;
      if (i >= p.seq_q) continue;
      if (p.lse != nullptr && quad == 0) {
        const float lse = sum > 0.f ? (row_max[h] * p.scale_log2 + __log2f(sum)) * 0.69314718055994531f : -INFINITY;
        p.lse[(static_cast<int64_t>(w.batch) * p.heads_q + w.head) * p.seq_q + i] = lse;
      }
      T* row = out + static_cast<int64_t>(i) * p.o_stride_s;
#pragma unroll
      for (int j = 0; j < kOutTiles; ++j) {
        const uint32_t packed = MmaType<T>::pack(o_acc[4 * j + 2 * h] * inv, o_acc[4 * j + 2 * h + 1] * inv);
        *reinterpret_cast<uint32_t*>(row + 8 * j + 2 * quad) = packed;
      }
    }
  }
#else
  __trap();  // selected only on compute capability 9.0 devices of a build with sm_90a code
#endif
}

}  // namespace tessel::cuda::detail
