// The XAttention estimator's score GEMM on Hopper: wgmma reading both operands from shared memory.
//
// Same work and output as the mma.sync kernel (xattention_estimation.cu): antidiagonal scores of
// 128 group rows x kCols group columns per tile, reduced in the epilogue to one log-sum-exp per
// (row, kv block), never stored. What changes is the inner product: the mma.sync kernel spends
// most of its issue slots on ldmatrix and per-warp m16n8k16 MMAs and measured latency-bound
// (docs/perf-log.md); here each warpgroup issues four m64nNk16 wgmmas per
// 64-wide slice straight from the swizzled tiles cp.async wrote (wgmma.cuh), with no register
// fragments to load.
//
// Two shapes (their measured times: docs/benchmarks.md and docs/perf-log.md):
//  - kCols 128 (the default, the faster): 3 stages, two CTAs per SM; each step waits for its own
//    wgmmas (the other CTA keeps the tensor cores busy across barriers). Faster than mma.sync.
//  - kCols 256: 4 stages, one CTA per SM, more FLOP per loaded byte; one wgmma group stays in
//    flight across the barrier, so loads run two steps ahead instead of three, which measured slower.
// Still short of the tensor cores' peak: every step ends in a CTA-wide barrier. A producer warp
// feeding stages through mbarriers (TMA, warp specialization) is the next step.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "cuda/flash_forward_kernel.cuh"
#include "cuda/hopper/device_support.h"
#include "cuda/wgmma.cuh"
#include "cuda/xattention_scores_wgmma.h"
#include "cuda/xattention_tile.cuh"

namespace tessel::cuda::detail {

namespace {

constexpr int kThreads = 256;  // two warpgroups, 64 rows each
constexpr int kRows = 128;
constexpr int kSlice = kXAttentionSlice;

template <int kCols>
struct WgmmaTile {
  static constexpr int kStages = kCols == 128 ? 3 : 4;
  // Keep one wgmma group in flight across the barrier: the stage it reads cannot be refilled in
  // the next step, so loads run kStages - 2 steps ahead instead of kStages - 1.
  static constexpr bool kOverlap = kCols == 256;
  static constexpr int kPrefetch = kStages - 1 - (kOverlap ? 1 : 0);
  static constexpr int kMinBlocks = kCols == 128 ? 2 : 1;
  static constexpr uint32_t kRowSliceBytes = kRows * kSlice * 2;
  static constexpr uint32_t kStageBytes = kRowSliceBytes + kCols * kSlice * 2;
  template <int kUnit>
  static constexpr int smem_bytes() {
    return 1024 /* alignment slack */ + kStages * kStageBytes + kRows * (kCols / kUnit) * 4;
  }
};

// One work item per (b, h, row tile, column tile), column tile fastest (CTAs running at the same
// time share q rows and k columns in L2).
struct TileItem {
  int b, h, g0, c0;
};

#if TESSEL_WGMMA_AVAILABLE  // only the sm_90a pass has a kernel body using it
__device__ __forceinline__ TileItem decode_item(int item, int row_tiles, int col_tiles, int heads, int cols) {
  const int ct = item % col_tiles, rest = item / col_tiles;
  const int rt = rest % row_tiles, bh = rest / row_tiles;
  return {bh / heads, bh % heads, rt * kRows, ct * cols};
}
#endif

// A persistent grid: CTA j takes items j, j + gridDim.x, ..., one pipeline running through all of
// them. With a fixed chunk of four column tiles per CTA (the mma.sync kernel's grid), the last of
// ~9 waves at S = 29700 held a tenth of the SMs for four tile-times; here the rounds differ by at
// most one tile.
template <typename T, int kUnit, int kCols>
__global__ void __launch_bounds__(kThreads, WgmmaTile<kCols>::kMinBlocks)
    xattention_block_lse_wgmma_kernel(const XAttentionParams p) {
#if TESSEL_WGMMA_AVAILABLE
  using Tile = WgmmaTile<kCols>;
  using Operands = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, Bf16Operands, F16Operands>;
  constexpr int kStages = Tile::kStages, kN8 = kCols / 8, kUnitsPerTile = kCols / kUnit;
  constexpr uint32_t kStageBytes = Tile::kStageBytes;
  extern __shared__ unsigned char smem[];
  // The 128-byte swizzle is defined on 1024-byte aligned addresses.
  const uint32_t s_raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t s_base = (s_raw + 1023u) & ~1023u;
  float* s_unit = reinterpret_cast<float*>(smem + (s_base - s_raw) + kStages * kStageBytes);  // [kRows][kUnitsPerTile]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, group = lane >> 2, quad = lane & 3;
  const int warpgroup = warp >> 2;
  const int warp_row = warpgroup * 64 + (warp & 3) * 16;  // this warp's 16 accumulator rows
  const int S = p.stride;
  const int row_tiles = (p.groups_q + kRows - 1) / kRows, col_tiles = (p.groups_kv + kCols - 1) / kCols;
  const int items = p.batch * p.heads_q * row_tiles * col_tiles;
  if (static_cast<int>(blockIdx.x) >= items) return;
  const int my_items = (items - 1 - static_cast<int>(blockIdx.x)) / static_cast<int>(gridDim.x) + 1;
  const int slices_per_token = p.dim / kSlice;
  const int slices = S * slices_per_token;  // inner steps per tile
  const int steps = my_items * slices;
  const int group_kv_block = p.block_kv / S;  // groups per kv block: a power of two, 4..128
  const int block_shift = __ffs(group_kv_block) - 1;
  const int group_heads = p.heads_q / p.heads_kv;

  StridedSliceLoader<kRows, kCols, kThreads> loader{p.q_stride_s, p.k_stride_s, p.seq_q, p.seq_kv, S, slices_per_token,
                                                    nullptr, nullptr, 0, 0};
  auto point_loader = [&](int item) {
    const TileItem t = decode_item(item, row_tiles, col_tiles, p.heads_q, kCols);
    loader.q = static_cast<const uint16_t*>(p.q) + t.b * p.q_stride_b + t.h * p.q_stride_h;
    loader.k = static_cast<const uint16_t*>(p.k) + t.b * p.k_stride_b + (t.h / group_heads) * p.k_stride_h;
    loader.g0 = t.g0;
    loader.c0 = t.c0;
  };
  int load_item = blockIdx.x;
  point_loader(load_item);
  int issued = 0, issue_stage = 0;
  auto issue = [&]() {
    if (issued < steps && loader.load(s_base + issue_stage * kStageBytes, tid)) {
      load_item += gridDim.x;
      if (load_item < items) point_loader(load_item);
    }
    ++issued;
    issue_stage = issue_stage + 1 == kStages ? 0 : issue_stage + 1;
    cp_async_commit();
  };
  for (int step = 0; step < Tile::kPrefetch; ++step) issue();

  int item = blockIdx.x;
  TileItem tile = decode_item(item, row_tiles, col_tiles, p.heads_q, kCols);
  float acc[kCols / 2];
#pragma unroll
  for (int i = 0; i < kCols / 2; ++i) acc[i] = 0.f;

  int stage = 0, slice = 0;
  for (int n = 0; n < steps; ++n) {
    cp_async_wait_pending<Tile::kPrefetch - 1>();  // step n's slices landed (this thread's copies) ...
    fence_proxy_async_shared();                    // ... visible to the tensor cores' proxy ...
    __syncthreads();  // ... for every thread's copies; and the stage refilled next is no longer read
    issue();

    // A warpgroup whose 64 rows all lie past groups_q skips its MMAs (warpgroup-uniform). Not with
    // a wgmma group in flight across the loop: ptxas then serializes every wgmma (warning C7518).
    const bool rows_active = Tile::kOverlap || tile.g0 + warpgroup * 64 < p.groups_q;
    if (rows_active) {
      const uint32_t sa = s_base + stage * kStageBytes + warpgroup * 64 * kSlice * 2;
      const uint32_t sb = s_base + stage * kStageBytes + Tile::kRowSliceBytes;
      const uint64_t desc_a = wgmma_desc_k_major_sw128(sa), desc_b = wgmma_desc_k_major_sw128(sb);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kSlice / 16; ++kk) {
        // The first k16 of a tile overwrites the accumulators (no zeroing pass between tiles).
        const int accumulate = slice > 0 || kk > 0;
        wgmma_ss(acc, desc_a + 2 * kk, desc_b + 2 * kk, accumulate, Operands{});  // N = kCols
      }
      wgmma_commit();
      if constexpr (Tile::kOverlap)
        wgmma_wait<1>();
      else
        wgmma_wait<0>();
      wgmma_fence_operands(acc);
    }
    stage = stage + 1 == kStages ? 0 : stage + 1;
    if (++slice < slices) continue;
    slice = 0;
    if constexpr (Tile::kOverlap) {
      wgmma_wait<0>();
      wgmma_fence_operands(acc);
    }

    // Column tile complete: per (row, unit of kUnit columns) log-sum-exp into shared memory.
    const int c0 = tile.c0, g0 = tile.g0;
    float* out = p.block_lse2 + (static_cast<int64_t>(tile.b) * p.heads_q + tile.h) * p.groups_q * p.kv_blocks;
    uint64_t scored = 0;  // this lane's columns c0 + 8 nt + 2 quad + e, bit 2 nt + e
#pragma unroll
    for (int nt = 0; nt < kN8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (group_column_scored(p, c0 + nt * 8 + quad * 2 + e, block_shift)) scored |= 1ull << (nt * 2 + e);
    // Per row: one max over the tile's columns, then per unit a sum of exp2(x - max). A unit whose
    // sum underflows (all its scores 2^126 below the row's best) gets -inf: its mass is 0 in fp32
    // anyway, as in the CPU definition.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 2 * kN8; ++j)
        if ((scored >> j) & 1ull) mx = fmaxf(mx, acc[(j / 2) * 4 + half * 2 + (j & 1)] * p.logit_scale_log2);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float base = mx == -INFINITY ? 0.f : mx;
      float* row_units = s_unit + (warp_row + group + half * 8) * kUnitsPerTile;
#pragma unroll
      for (int nt = 0; nt < kN8; ++nt) {
        float sum = 0.f;
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if ((scored >> (nt * 2 + e)) & 1ull) sum += fast_exp2(acc[nt * 4 + half * 2 + e] * p.logit_scale_log2 - base);
#pragma unroll
        for (int o = 1; o < kUnit / 2; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if ((quad * 2) % kUnit == 0) row_units[(nt * 8 + quad * 2) / kUnit] = sum > 0.f ? base + __log2f(sum) : -INFINITY;
      }
    }
    __syncthreads();
    store_tile_block_lse<kRows, kUnitsPerTile, kUnit, kThreads>(s_unit, p, out, g0, c0, group_kv_block, tid);
    // The next write to s_unit comes after at least one more step, whose __syncthreads orders it.
    item += gridDim.x;
    if (item < items) tile = decode_item(item, row_tiles, col_tiles, p.heads_q, kCols);
  }
  cp_async_wait_pending<0>();
#else
  static_assert(WgmmaTile<kCols>::kPrefetch >= 1 && (WgmmaTile<kCols>::kOverlap || kCols == 128));
  __trap();  // never launched: the host selects this kernel only where sm_90a code exists
#endif
}

template <typename T, int kUnit, int kCols>
void launch_shaped(const XAttentionParams& p, int multiprocessors, cudaStream_t stream) {
  using Tile = WgmmaTile<kCols>;
  constexpr int kSmem = Tile::template smem_bytes<kUnit>();
  static const cudaError_t attribute = cudaFuncSetAttribute(xattention_block_lse_wgmma_kernel<T, kUnit, kCols>,
                                                            cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  (void)attribute;
  const int64_t items = static_cast<int64_t>(p.batch) * p.heads_q * ((p.groups_q + kRows - 1) / kRows) *
                        ((p.groups_kv + kCols - 1) / kCols);
  if (items > std::numeric_limits<int>::max())
    throw std::invalid_argument("XAttention wgmma kernel: more than 2^31 - 1 tiles (batch x heads x row tiles x column tiles)");
  const int grid = static_cast<int>(std::min<int64_t>(items, static_cast<int64_t>(multiprocessors) * Tile::kMinBlocks));
  xattention_block_lse_wgmma_kernel<T, kUnit, kCols><<<grid, kThreads, kSmem, stream>>>(p);
}

template <typename T, int kCols>
void launch_typed(const XAttentionParams& p, int multiprocessors, cudaStream_t stream) {
  if (p.block_kv / p.stride == 4)
    launch_shaped<T, 4, kCols>(p, multiprocessors, stream);
  else
    launch_shaped<T, 8, kCols>(p, multiprocessors, stream);
}

}  // namespace

bool xattention_wgmma_supported() { return current_hopper_device().supported; }

void launch_xattention_block_lse_wgmma(const XAttentionParams& p, DType dtype, int cols, cudaStream_t stream) {
  const HopperDevice device = current_hopper_device();
  if (!device.supported)
    throw std::runtime_error("XAttention wgmma kernel: needs a compute capability 9.0 device and a build with sm_90a");
  if (cols != 128 && cols != 256) throw std::invalid_argument("XAttention wgmma kernel: cols must be 128 or 256");
  const bool bf16 = dtype == DType::kBF16;
  const int sms = device.multiprocessors;
  if (cols == 128)
    bf16 ? launch_typed<__nv_bfloat16, 128>(p, sms, stream) : launch_typed<__half, 128>(p, sms, stream);
  else
    bf16 ? launch_typed<__nv_bfloat16, 256>(p, sms, stream) : launch_typed<__half, 256>(p, sms, stream);
}

}  // namespace tessel::cuda::detail
