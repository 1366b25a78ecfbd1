// XAttention (threshold) mask estimation on the device, in one pass over the scores.
//
// The antidiagonal scores A[g][g'] = Σ_i q[gS + S-1-i] · k[g'S + i] are a GEMM whose inner index
// runs over (i, d): row g of the left operand is the query tokens of group g in reverse order,
// column g' of the right operand the key tokens of group g' in order. Both are strided views of
// q and k (rows S tokens apart), so 64-wide slices of them stream through shared memory with
// cp.async and multiply on the tensor cores (mma.sync m16n8k16, fp32 accumulation), a 128 x 128
// tile of group rows x group columns per CTA (8 warps of 32 x 64), two CTAs per SM, kStages
// slices in flight.
//
// 128 x 128 tiles with 2 CTAs/SM measured faster than 256 x 128 tiles (64 x 64 per warp, more FLOP
// per loaded byte) with one CTA/SM; Nsight Compute shows the kernel latency-bound (tensor pipe
// mostly idle, L2 and DRAM far from busy), so more resident warps beat more reuse (numbers:
// docs/perf-log.md). This kernel is the sm_80 path (and
// that of builds without sm_90a); compute capability 9.0 runs the wgmma version of the same GEMM
// (xattention_scores_wgmma.cu), chosen in launch_xattention_block_mass.
//
// The epilogue never materializes the score matrix: per row and kv block it keeps the scores'
// log-sum-exp (log2 domain), first over units of kUnit columns in registers and shuffles, then
// over the units of a block through shared memory. A row's softmax mass in block c is
// exp2(lse[c] - logsumexp2(lse[·])), so the masses come out exact without a second pass (the
// previous design recomputed every score in a second pass to normalize them).
//
// Arithmetic: bf16/fp16 products with fp32 accumulation, where the CPU definition sums fp32
// products; masses agree to about 1e-3 relative.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/flash_forward_kernel.cuh"
#include "cuda/mask_rows.cuh"
#include "tessel/kernels/cuda/xattention_estimation.h"
#include "cuda/xattention_scores_wgmma.h"
#include "cuda/xattention_tile.cuh"

namespace tessel::cuda::detail {

namespace {

constexpr int kTile = 128;       // group columns per CTA tile
constexpr int kSlice = kXAttentionSlice;
constexpr int kThreads = 256;    // 8 warps: 4 along rows x 2 along columns (64 each)
constexpr int kTilesPerCta = 4;  // column tiles one CTA walks through (keeps the pipeline full across tiles)
constexpr uint32_t kColSliceBytes = kTile * kSlice * 2;

// WM m16 tiles per warp: 4 -> 256-row CTA tiles, one CTA per SM (255 registers); 2 -> 128-row
// tiles, two CTAs per SM.
template <int WM>
struct TileShape {
  static constexpr int kRows = WM * 16 * 4;
  static constexpr int kStages = WM == 4 ? 4 : 3;
  static constexpr int kMinBlocks = WM == 4 ? 1 : 2;
  static constexpr uint32_t kRowSliceBytes = kRows * kSlice * 2;
  static constexpr uint32_t kStageBytes = kRowSliceBytes + kColSliceBytes;
};
constexpr int kMassThreads = 256;
constexpr int kSelectThreads = 256;

// The warp's MMA accumulators (WM m16 tiles x 8 n8 tiles x 4 floats per lane) to 0.
template <int WM>
__device__ __forceinline__ void zero_accumulators(float (&acc)[WM][8][4]) {
#pragma unroll
  for (int mt = 0; mt < WM; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
}

// One 64-wide inner slice for a warp's M m16 tiles x 64 columns: A fragments by ldmatrix, B
// fragments two n8 tiles per ldmatrix.x4, M x 8 MMAs per k16. a_off / b_off: the lane's swizzled
// byte offsets for each k16 (the m16 / n16 steps add constants), computed once per kernel: address
// math per ldmatrix was a third of the issued instructions.
template <typename T, int M, int WM>
__device__ __forceinline__ void mma_slice(float (&acc)[WM][8][4], uint32_t sa, uint32_t sb, const uint32_t (&a_off)[4],
                                          const uint32_t (&b_off)[4]) {
#pragma unroll
  for (int kk = 0; kk < kSlice / 16; ++kk) {
    uint32_t a[M][4];
#pragma unroll
    for (int mt = 0; mt < M; ++mt) ldmatrix_x4(a[mt], sa + a_off[kk] + mt * 16 * kSlice * 2);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t bf[4];
      ldmatrix_x4(bf, sb + b_off[kk] + np * 16 * kSlice * 2);
#pragma unroll
      for (int mt = 0; mt < M; ++mt) {
        mma_16816<T>(acc[mt][2 * np], a[mt], bf);
        mma_16816<T>(acc[mt][2 * np + 1], a[mt], bf + 2);
      }
    }
  }
}

// mma_slice over the warp's first `active` m16 tiles (those with rows inside groups_q), chosen
// once per step among the compile-time counts M, M-1, ..., 1.
template <typename T, int M, int WM>
__device__ __forceinline__ void mma_active_tiles(int active, float (&acc)[WM][8][4], uint32_t sa, uint32_t sb,
                                                 const uint32_t (&a_off)[4], const uint32_t (&b_off)[4]) {
  if (active == M)
    mma_slice<T, M, WM>(acc, sa, sb, a_off, b_off);
  else if constexpr (M > 1)
    mma_active_tiles<T, M - 1, WM>(active, acc, sa, sb, a_off, b_off);
}

// Grid: (row tiles x column splits, H_q, B). Writes block_lse2[b][h][g][c] for the CTA's rows g
// and the kv blocks c of its column tiles.
template <typename T, int kUnit, int WM>
__global__ void __launch_bounds__(kThreads, TileShape<WM>::kMinBlocks)
    xattention_block_lse_kernel(const XAttentionParams p, int col_splits) {
  using Shape = TileShape<WM>;
  constexpr int kRows = Shape::kRows, kStages = Shape::kStages;
  constexpr uint32_t kStageBytes = Shape::kStageBytes, kRowSliceBytes = Shape::kRowSliceBytes;
  constexpr int kUnitsPerTile = kTile / kUnit;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  float* s_unit = reinterpret_cast<float*>(smem + kStages * kStageBytes);  // [kRows][kUnitsPerTile]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, group = lane >> 2, quad = lane & 3;
  // Warps 2w and 2w+1 share rows: a partial last row tile idles row warps, and this spreads the
  // idle ones over the four SM sub-partitions (warp w runs on sub-partition w % 4).
  const int warp_row = (warp >> 1) * WM * 16, warp_col = (warp & 1) * 64;
  const int row_tile = blockIdx.x / col_splits, split = blockIdx.x % col_splits;
  const int g0 = row_tile * kRows, h = blockIdx.y, b = blockIdx.z;
  // m16 tiles of this warp with at least one row inside groups_q (warp-uniform).
  const int active_m = min(WM, max(0, (p.groups_q - g0 - warp_row + 15) / 16));
  const int hk = h / (p.heads_q / p.heads_kv);
  const int S = p.stride;
  const uint16_t* q = static_cast<const uint16_t*>(p.q) + b * p.q_stride_b + h * p.q_stride_h;
  const uint16_t* k = static_cast<const uint16_t*>(p.k) + b * p.k_stride_b + hk * p.k_stride_h;

  const int col_tiles = (p.groups_kv + kTile - 1) / kTile;
  const int first_tile = split * kTilesPerCta;
  const int tiles = min(kTilesPerCta, col_tiles - first_tile);
  if (tiles <= 0) return;
  const int slices_per_token = p.dim / kSlice;
  const int slices = S * slices_per_token;  // inner steps per tile
  const int steps = tiles * slices;
  const int group_kv_block = p.block_kv / S;  // groups per kv block: a power of two, 4..128

  // Loads run kStages - 1 steps ahead of the MMAs.
  StridedSliceLoader<kRows, kTile, kThreads> loader{p.q_stride_s, p.k_stride_s, p.seq_q, p.seq_kv, S, slices_per_token,
                                                    q, k, g0, first_tile * kTile};
  int issued = 0, issue_stage = 0;
  auto issue = [&]() {
    if (issued < steps && loader.load(s_base + issue_stage * kStageBytes, tid)) loader.c0 += kTile;
    ++issued;
    issue_stage = issue_stage + 1 == kStages ? 0 : issue_stage + 1;
    cp_async_commit();
  };
  for (int step = 0; step < kStages - 1; ++step) issue();

  float acc[WM][8][4];
  zero_accumulators(acc);

  float* out = p.block_lse2 + (static_cast<int64_t>(b) * p.heads_q + h) * p.groups_q * p.kv_blocks;
  const int block_shift = __ffs(group_kv_block) - 1;
  // Rows of both tiles are multiples of 8 plus a lane term, so row & 7 = lane & 7 and the swizzle
  // (16-byte chunk XOR row & 7) depends on the lane and k16 only: swizzled<kSlice>(row, col) below.
  uint32_t a_off[4], b_off[4];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    a_off[kk] = swizzled<kSlice>(warp_row + (lane & 15), kk * 16 + (lane >> 4) * 8);
    b_off[kk] = swizzled<kSlice>(warp_col + (lane & 7) + ((lane >> 4) << 3), kk * 16 + ((lane >> 3) & 1) * 8);
  }
  int stage = 0, slice = 0, tile = 0;
  for (int n = 0; n < steps; ++n) {
    cp_async_wait_pending<kStages - 2>();  // step n's slices landed ...
    __syncthreads();                       // ... for every thread; and the stage step n - 1 read is free
    issue();

    const uint32_t sa = s_base + stage * kStageBytes, sb = sa + kRowSliceBytes;
    // One uniform branch per step (not per MMA: per-MMA guards cost a branch each and broke the
    // scheduling; docs/perf-log.md).
    mma_active_tiles<T, WM, WM>(active_m, acc, sa, sb, a_off, b_off);
    stage = stage + 1 == kStages ? 0 : stage + 1;
    if (++slice < slices) continue;
    slice = 0;

    // Column tile complete: per (row, unit of kUnit columns) log-sum-exp into shared memory.
    const int c0 = (first_tile + tile++) * kTile;
    // Validity of this lane's two columns in each n8 tile (groups past the sequence, or past a
    // partially filled block's valid groups, are excluded from the softmax).
    uint32_t valid_bits = 0;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int col = c0 + warp_col + nt * 8 + quad * 2;  // this lane's columns: col, col + 1
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (group_column_scored(p, col + e, block_shift)) valid_bits |= 1u << (nt * 2 + e);
    }
    // Per row: one max over the warp's 64 columns, then per unit a sum of exp2(x - max). A unit
    // whose sum underflows (all its scores 2^126 below the row's best) gets -inf: its mass is 0 in
    // fp32 anyway, as in the CPU definition. Half the shuffles of a max per unit.
#pragma unroll
    for (int mt = 0; mt < WM; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float v[16];
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          v[j] = (valid_bits >> j) & 1u ? acc[mt][j / 2][half * 2 + (j & 1)] * p.logit_scale_log2 : -INFINITY;
          mx = fmaxf(mx, v[j]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float base = mx == -INFINITY ? 0.f : mx;
        float* row_units = s_unit + (warp_row + mt * 16 + group + half * 8) * kUnitsPerTile;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          float sum = fast_exp2(v[2 * nt] - base) + fast_exp2(v[2 * nt + 1] - base);
#pragma unroll
          for (int o = 1; o < kUnit / 2; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
          if ((quad * 2) % kUnit == 0)
            row_units[(warp_col + nt * 8 + quad * 2) / kUnit] = sum > 0.f ? base + __log2f(sum) : -INFINITY;
        }
      }
    zero_accumulators(acc);
    __syncthreads();
    store_tile_block_lse<kRows, kUnitsPerTile, kUnit, kThreads>(s_unit, p, out, g0, c0, group_kv_block, tid);
    // The next write to s_unit comes after at least one more step, whose __syncthreads orders it.
  }
  cp_async_wait_pending<0>();
}

// One CTA per (q block r, head h, batch b): each group row's log-sum-exp over all kv blocks (one
// warp per row), then, per kv block, the sum over the rows of their softmax mass (one thread per
// block, rows in order: deterministic, so graph replays and reruns select the same blocks).
// kZeroGroups (p.zero_groups_total > 0, padding kChunk): the padded keys' zero groups join every
// row's softmax. A template argument, so that the kernel without them carries none of their work.
// Both instances are held to 32 registers (8 CTAs per SM, no spills), as the kernel was before
// the zero groups: unbounded, the zero-group instance took 40 and lost a quarter of its CTAs.
template <bool kZeroGroups>
__global__ void __launch_bounds__(kMassThreads, 8) xattention_mass_kernel(const XAttentionParams p) {
  extern __shared__ float s_row_lse[];
  const int r = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, warps = blockDim.x >> 5;
  const int rows_per_block = p.block_q / p.stride;
  const int g_begin = r * rows_per_block, g_end = min(p.groups_q, g_begin + rows_per_block);
  const float* lse = p.block_lse2 + (static_cast<int64_t>(b) * p.heads_q + h) * p.groups_q * p.kv_blocks;
  for (int g = g_begin + warp; g < g_end; g += warps) {
    const float* row = lse + static_cast<int64_t>(g) * p.kv_blocks;
    float mx = -INFINITY;
    for (int c = lane; c < p.kv_blocks; c += 32) mx = fmaxf(mx, row[c]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
    if (mx != -INFINITY)
      for (int c = lane; c < p.kv_blocks; c += 32) sum += fast_exp2(row[c] - mx);
    sum = warp_sum(sum);
    if (lane == 0) {
      float row_lse = lse2_of(mx, sum);
      if constexpr (kZeroGroups) {
        // The zero groups' logit is 0: log2 of their summed exponentials is log2(count).
        const float zeros = log2f(static_cast<float>(p.zero_groups_total));
        const float top = fmaxf(row_lse, zeros);
        row_lse = top + log2f(exp2f(row_lse - top) + exp2f(zeros - top));
      }
      s_row_lse[g - g_begin] = row_lse;
    }
  }
  __syncthreads();
  const int64_t mass_row = (static_cast<int64_t>(b) * p.heads_q + h) * p.q_blocks + r;
  float zero_group = 0.f;
  if constexpr (kZeroGroups) {
    for (int g = g_begin; g < g_end; ++g) zero_group += exp2f(-s_row_lse[g - g_begin]);
    if (tid == 0) p.zero_group_mass[mass_row] = zero_group;
  }
  float* mass = p.mass + mass_row * p.kv_blocks;
  for (int c = tid; c < p.kv_blocks; c += blockDim.x) {
    float m = 0.f;
    for (int g = g_begin; g < g_end; ++g) {
      const float row_lse = s_row_lse[g - g_begin];
      if (row_lse != -INFINITY) m += fast_exp2(lse[static_cast<int64_t>(g) * p.kv_blocks + c] - row_lse);
    }
    if constexpr (kZeroGroups)
      if (c == p.kv_blocks - 1) m += static_cast<float>(p.zero_groups_last_block) * zero_group;
    mass[c] = m;
  }
}

// One CTA per (q block r, head h, batch b), over the real and the padding blocks: forced blocks
// (diagonal), then the others by (mass desc, c asc) while the kept mass is below threshold x the
// row's total, then block 0 (keep_first) and the row's real ids ascending. The greedy rule runs in parallel: sorted entry i is kept iff forced + (sum of the
// sorted masses before i) < target, a prefix sum (double, fixed order, so replays select the same
// blocks). A single-thread loop over the row was a large share of the whole estimate at S = 29700
// (docs/perf-log.md). kPadded (p.pad_blocks > 0) as kZeroGroups above: without padding blocks
// the kernel reads no zero-group mass and fills the masses with no per-block branch. Held to 32
// registers (8 CTAs per SM, no spills) like the mass kernel; unbounded, one instance took 39.
template <bool kPadded>
__global__ void __launch_bounds__(kSelectThreads, 8) select_threshold_rows_kernel(const XAttentionParams p, int sort_size) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned long long* keys = reinterpret_cast<unsigned long long*>(smem);
  float* s_mass = reinterpret_cast<float*>(keys + sort_size);
  // keep follows all kv_blocks + pad_blocks masses (it overlapped the padding masses before).
  uint8_t* keep = reinterpret_cast<uint8_t*>(s_mass + p.kv_blocks + p.pad_blocks);
  const int r = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int real_blocks = p.kv_blocks, kvb = kPadded ? p.kv_blocks + p.pad_blocks : p.kv_blocks;
  const int64_t row = (static_cast<int64_t>(b) * p.heads_q + h) * p.q_blocks + r;
  const float* m = p.mass + row * real_blocks;

  // The real blocks, then the padding blocks (zero groups only).
  if constexpr (kPadded) {
    const float zero_group = p.zero_group_mass[row];
    const int groups_per_block = p.block_kv / p.stride;
    for (int c = tid; c < kvb; c += blockDim.x) {
      keep[c] = 0;
      s_mass[c] = c < real_blocks ? m[c]
                                  : static_cast<float>(c == kvb - 1 ? p.zero_groups_last_pad : groups_per_block) * zero_group;
    }
  } else {
    for (int c = tid; c < kvb; c += blockDim.x) {
      keep[c] = 0;
      s_mass[c] = m[c];
    }
  }
  __syncthreads();
  if (p.keep_diagonal) keep_diagonal_blocks(keep, r, p.seq_q, p.seq_kv, p.block_q, p.block_kv);
  __syncthreads();
  for (int i = tid; i < sort_size; i += blockDim.x) {
    unsigned long long key = 0ull;
    if (i < kvb && !keep[i])
      key = (static_cast<unsigned long long>(__float_as_uint(s_mass[i])) << 32) | (0xffffffffu - static_cast<unsigned>(i));
    keys[i] = key;
  }
  bitonic_sort_descending(keys, sort_size);
  __syncthreads();
  // Row totals over contiguous per-thread chunks: all mass, forced mass, candidates.
  const int chunk = (kvb + blockDim.x - 1) / blockDim.x;
  const int c0 = min(kvb, tid * chunk), c1 = min(kvb, c0 + chunk);
  double my_total = 0.0, my_forced = 0.0;
  int my_others = 0;
  for (int c = c0; c < c1; ++c) {
    my_total += s_mass[c];
    if (keep[c]) my_forced += s_mass[c];
    else ++my_others;
  }
  double total = 0.0, forced = 0.0;
  int others = 0;
  block_exclusive_scan(my_total, &total);
  block_exclusive_scan(my_forced, &forced);
  block_exclusive_scan(my_others, &others);
  const double target = static_cast<double>(p.head_threshold ? p.head_threshold[h] : p.threshold) * total;
  // The candidates are the first `others` sorted keys; each key carries its mass in the high word.
  const int sort_chunk = (others + blockDim.x - 1) / blockDim.x;
  const int s0 = min(others, tid * sort_chunk), s1 = min(others, s0 + sort_chunk);
  double my_sorted = 0.0;
  for (int i = s0; i < s1; ++i) my_sorted += __uint_as_float(static_cast<unsigned>(keys[i] >> 32));
  double all_sorted = 0.0;
  double kept = forced + block_exclusive_scan(my_sorted, &all_sorted);
  for (int i = s0; i < s1 && kept < target; ++i) {
    const unsigned long long key = keys[i];
    keep[static_cast<int>(0xffffffffu - static_cast<unsigned>(key & 0xffffffffull))] = 1;
    kept += __uint_as_float(static_cast<unsigned>(key >> 32));
  }
  __syncthreads();
  // Block 0 after the selection, without counting toward it (as the official selection keeps it);
  // the barrier only when it is set (keep_first is the same for the whole CTA).
  if (p.keep_first) {
    if (tid == 0) keep[0] = 1;
    __syncthreads();
  }
  write_kept_row(keep, real_blocks, p.row_blocks + row * real_blocks, p.row_counts + row);
}

template <bool kPadded>
void launch_threshold_selection(const XAttentionParams& p, int sort_size, size_t smem, cudaStream_t stream) {
  // Once per instance: room for the largest row the selection takes (4096 blocks, padding included).
  static const cudaError_t attribute_status =
      cudaFuncSetAttribute(select_threshold_rows_kernel<kPadded>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           4096 * (sizeof(unsigned long long) + sizeof(float) + 1));
  (void)attribute_status;
  select_threshold_rows_kernel<kPadded>
      <<<dim3(p.q_blocks, p.heads_q, p.batch), kSelectThreads, smem, stream>>>(p, sort_size);
}

template <typename T, int kUnit, int WM>
void launch_block_lse(const XAttentionParams& p, cudaStream_t stream) {
  using Shape = TileShape<WM>;
  constexpr int kSmem = Shape::kStages * Shape::kStageBytes + Shape::kRows * (kTile / kUnit) * 4;
  static const cudaError_t attribute = cudaFuncSetAttribute(xattention_block_lse_kernel<T, kUnit, WM>,
                                                            cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  (void)attribute;
  const int row_tiles = (p.groups_q + Shape::kRows - 1) / Shape::kRows, col_tiles = (p.groups_kv + kTile - 1) / kTile;
  const int col_splits = (col_tiles + kTilesPerCta - 1) / kTilesPerCta;
  const dim3 grid(row_tiles * col_splits, p.heads_q, p.batch);
  xattention_block_lse_kernel<T, kUnit, WM><<<grid, kThreads, kSmem, stream>>>(p, col_splits);
}

template <typename T, int WM>
void launch_block_lse_shaped(const XAttentionParams& p, cudaStream_t stream) {
  if (p.block_kv / p.stride == 4)
    launch_block_lse<T, 4, WM>(p, stream);
  else
    launch_block_lse<T, 8, WM>(p, stream);
}

// 128-row tiles, two CTAs per SM: faster than 256-row tiles with one CTA per SM (see the top).
template <typename T>
void launch_block_lse_typed(const XAttentionParams& p, cudaStream_t stream) {
  launch_block_lse_shaped<T, 2>(p, stream);
}

}  // namespace

void launch_xattention_block_mass(const XAttentionParams& p, DType dtype, cudaStream_t stream) {
  XAttentionGemm gemm = p.gemm;
  if (gemm == XAttentionGemm::kAuto) gemm = xattention_wgmma_supported() ? XAttentionGemm::kWgmma128 : XAttentionGemm::kMmaSync;
  if (gemm == XAttentionGemm::kWgmma128 || gemm == XAttentionGemm::kWgmma256)
    launch_xattention_block_lse_wgmma(p, dtype, gemm == XAttentionGemm::kWgmma128 ? 128 : 256, stream);
  else if (dtype == DType::kBF16)
    launch_block_lse_typed<__nv_bfloat16>(p, stream);
  else
    launch_block_lse_typed<__half>(p, stream);
  const size_t smem = static_cast<size_t>(p.block_q / p.stride) * sizeof(float);
  const dim3 grid(p.q_blocks, p.heads_q, p.batch);
  if (p.zero_groups_total > 0)
    xattention_mass_kernel<true><<<grid, kMassThreads, smem, stream>>>(p);
  else
    xattention_mass_kernel<false><<<grid, kMassThreads, smem, stream>>>(p);
}

void launch_xattention_estimation(const XAttentionParams& p, DType dtype, cudaStream_t stream) {
  launch_xattention_block_mass(p, dtype, stream);
  const int selected_blocks = p.kv_blocks + p.pad_blocks;
  int sort_size = 1;
  while (sort_size < selected_blocks) sort_size <<= 1;
  const size_t smem = sort_size * sizeof(unsigned long long) + selected_blocks * (sizeof(float) + 1);
  if (p.pad_blocks > 0)
    launch_threshold_selection<true>(p, sort_size, smem, stream);
  else
    launch_threshold_selection<false>(p, sort_size, smem, stream);
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads_q * p.q_blocks;
  launch_rows_to_csr(p.row_blocks, p.row_counts, rows, p.kv_blocks, p.indptr, p.indices, stream);
}

}  // namespace tessel::cuda::detail
