// XAttention (threshold) mask estimation on the device. The antidiagonal scores
// A[g][g'] = Σ_i q[gS + S-1-i] · k[g'S + i] are a sum over i of products of two strided views
// (rows S apart), so they run on the tensor cores with the flash kernel's tiles: a CTA keeps the
// S query tiles of its 64 groups in shared memory and streams the S key tiles of each 64-group
// column tile. Pass 1 writes each group row's log-sum-exp; pass 2 recomputes the scores and adds
// the softmax probabilities into per-block masses (whole blocks per CTA: no atomics in global
// memory). Key tiles stream kStages deep. Arithmetic: bf16/fp16 products with fp32 accumulation, where the CPU definition sums
// fp32 products; masses agree to about 1e-3 relative.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/flash_forward_kernel.cuh"
#include "kernels/cuda/mask_rows.cuh"
#include "kernels/cuda/xattention_estimation.h"

namespace tessel::cuda::detail {

namespace {

constexpr int kGroupTile = 64;  // groups per CTA row tile and per column tile
constexpr int kMassTile = 16;   // at most 64*16/64 blocks per tile side
constexpr int kSelectThreads = 256;
constexpr int kStages = 4;  // key tiles in flight: each step is short (64 MMAs per warp), so loads need look-ahead

template <int N>
__device__ __forceinline__ void cp_async_wait_pending() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Rows j of a strided tile starting at token `first` (row j is token first + j*S) that lie
// before `seq`: the rest are zero-filled.
__device__ __forceinline__ int strided_rows_valid(int seq, int first, int stride) {
  const int left = seq - first;
  return left <= 0 ? 0 : min(kGroupTile, (left + stride - 1) / stride);
}

template <typename T, int D, int S, bool kMass>
__global__ void __launch_bounds__(128, 1) xattention_scores_kernel(const XAttentionParams p) {
  constexpr int kThreads = 128;
  constexpr uint32_t kTileBytes = kGroupTile * D * 2;
  constexpr int kNTiles = kGroupTile / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t s_k = s_q + S * kTileBytes;
  float* s_mass = reinterpret_cast<float*>(smem + (S + kStages) * kTileBytes);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, group = lane >> 2, quad = lane & 3;
  const int g0 = blockIdx.x * kGroupTile, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (p.heads_q / p.heads_kv);
  const uint16_t* q = static_cast<const uint16_t*>(p.q) + b * p.q_stride_b + h * p.q_stride_h;
  const uint16_t* k = static_cast<const uint16_t*>(p.k) + b * p.k_stride_b + hk * p.k_stride_h;
  const int64_t q_rows = S * p.q_stride_s, k_rows = S * p.k_stride_s;

#pragma unroll
  for (int i = 0; i < S; ++i) {
    const int first = g0 * S + S - 1 - i;  // reversed within the group: the antidiagonal
    const int valid = strided_rows_valid(p.seq_q, first, S);
    load_tile<D, kGroupTile, kThreads>(s_q + i * kTileBytes, valid > 0 ? q + static_cast<int64_t>(first) * p.q_stride_s : q,
                                       q_rows, valid, tid);
  }
  const int col_tiles = (p.groups_kv + kGroupTile - 1) / kGroupTile;
  const int steps = col_tiles * S;
  // Step n multiplies Q_i by K_i of column tile t (n = t*S + i); its key tile sits in stage n % kStages.
  auto issue = [&](int step) {
    if (step < steps) {
      const int first = (step / S) * kGroupTile * S + step % S;
      const int valid = strided_rows_valid(p.seq_kv, first, S);
      load_tile<D, kGroupTile, kThreads>(s_k + (step % kStages) * kTileBytes,
                                         valid > 0 ? k + static_cast<int64_t>(first) * p.k_stride_s : k, k_rows, valid,
                                         tid);
    }
    cp_async_commit();
  };
  for (int step = 0; step < kStages - 1; ++step) issue(step);
  if (kMass)
    for (int i = tid; i < kMassTile * kMassTile; i += kThreads) s_mass[i] = 0.f;

  const int64_t lse_base = (static_cast<int64_t>(b) * p.heads_q + h) * p.groups_q;
  const bool warp_sums = (p.block_q / S) % 16 == 0 && (p.block_kv / S) % 8 == 0;
  float row_lse2[2] = {0.f, 0.f}, row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  if (kMass)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int g = g0 + warp * 16 + group + half * 8;
      row_lse2[half] = g < p.groups_q ? p.row_lse2[lse_base + g] : 0.f;
    }
  float acc[kNTiles][4];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;

  for (int n = 0; n < steps; ++n) {
    const int t = n / S, i = n % S, stage = n % kStages;
    cp_async_wait_pending<kStages - 2>();  // step n's tile (and, at n = 0, the Q tiles) landed
    __syncthreads();                       // ... for every thread; and stage (n - 1) % kStages is free
    issue(n + kStages - 1);

    const uint32_t sq = s_q + i * kTileBytes, sk = s_k + stage * kTileBytes;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, sq + swizzled<D>(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t bf[4];
        ldmatrix_x4(bf, sk + swizzled<D>(np * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 16 + ((lane >> 3) & 1) * 8));
        mma_16816<T>(acc[2 * np], a, bf);
        mma_16816<T>(acc[2 * np + 1], a, bf + 2);
      }
    }

    if (i == S - 1) {  // column tile t complete
      const int col0 = t * kGroupTile;
      float part[kNTiles];
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) part[nt] = 0.f;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int local_row = warp * 16 + group + half * 8;
        if (!kMass) {
          float mx = row_max[half];
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (col0 + nt * 8 + quad * 2 + e < p.groups_kv)
                mx = fmaxf(mx, acc[nt][half * 2 + e] * p.logit_scale_log2);
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          float sum = row_sum[half] * fast_exp2(row_max[half] - mx);
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (col0 + nt * 8 + quad * 2 + e < p.groups_kv)
                sum += fast_exp2(acc[nt][half * 2 + e] * p.logit_scale_log2 - mx);
          row_max[half] = mx;
          row_sum[half] = sum;
        } else if (warp_sums) {
          // All 16 rows of the warp lie in one q block and each n8 tile in one kv block: reduce
          // over the warp first, then one shared atomic per tile (32 lanes on one address would
          // serialize: that made this pass 10x slower than pass 1).
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            float v = 0.f;
            if (g0 + local_row < p.groups_q)
#pragma unroll
              for (int e = 0; e < 2; ++e)
                if (col0 + nt * 8 + quad * 2 + e < p.groups_kv)
                  v += fast_exp2(acc[nt][half * 2 + e] * p.logit_scale_log2 - row_lse2[half]);
            part[nt] += v;
          }
        } else if (g0 + local_row < p.groups_q) {
          const int r_local = local_row * S / p.block_q;
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int col = nt * 8 + quad * 2 + e;
              if (col0 + col < p.groups_kv)
                atomicAdd(&s_mass[r_local * kMassTile + col * S / p.block_kv],
                          fast_exp2(acc[nt][half * 2 + e] * p.logit_scale_log2 - row_lse2[half]));
            }
        }
      }
      if (kMass && warp_sums) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          const float v = warp_sum(part[nt]);
          if (lane == 0) atomicAdd(&s_mass[(warp * 16 * S / p.block_q) * kMassTile + nt * 8 * S / p.block_kv], v);
        }
      }
      if (kMass) {
        __syncthreads();
        const int rows = kGroupTile * S / p.block_q, cols = kGroupTile * S / p.block_kv;
        const int r0 = g0 * S / p.block_q, c0 = col0 * S / p.block_kv;
        float* mass = p.mass + (static_cast<int64_t>(b) * p.heads_q + h) * p.q_blocks * p.kv_blocks;
        for (int idx = tid; idx < rows * cols; idx += kThreads) {
          const int rr = idx / cols, cc = idx % cols;
          if (r0 + rr < p.q_blocks && c0 + cc < p.kv_blocks)
            mass[static_cast<int64_t>(r0 + rr) * p.kv_blocks + c0 + cc] = s_mass[rr * kMassTile + cc];
          s_mass[rr * kMassTile + cc] = 0.f;
        }
      }
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
    }
  }

  if (!kMass)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = row_sum[half];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int g = g0 + warp * 16 + group + half * 8;
      if (quad == 0 && g < p.groups_q) p.row_lse2[lse_base + g] = row_max[half] + __log2f(sum);
    }
}

// One CTA per (q block r, head h, batch b): forced blocks (diagonal, first), then the others by
// (mass desc, c asc) while the kept mass is below threshold × the row's total (sums in double, in
// the CPU's order), then the row's ids ascending.
__global__ void select_threshold_rows_kernel(const XAttentionParams p, int sort_size) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned long long* keys = reinterpret_cast<unsigned long long*>(smem);
  uint8_t* keep = reinterpret_cast<uint8_t*>(keys + sort_size);
  const int r = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int kvb = p.kv_blocks;
  const int64_t row = (static_cast<int64_t>(b) * p.heads_q + h) * p.q_blocks + r;
  const float* m = p.mass + row * kvb;

  for (int c = tid; c < kvb; c += blockDim.x) keep[c] = 0;
  __syncthreads();
  if (p.keep_diagonal) {
    const int shift = p.seq_kv - p.seq_q;
    const int q_lo = r * p.block_q, q_hi = min(p.seq_q, q_lo + p.block_q) - 1;
    if (q_hi + shift >= 0 && q_lo + shift < p.seq_kv) {
      const int lo = min(max(q_lo + shift, 0), p.seq_kv - 1), hi = min(max(q_hi + shift, 0), p.seq_kv - 1);
      for (int c = lo / p.block_kv + tid; c <= hi / p.block_kv; c += blockDim.x) keep[c] = 1;
    }
  }
  if (p.keep_first && tid == 0) keep[0] = 1;
  __syncthreads();
  for (int i = tid; i < sort_size; i += blockDim.x) {
    unsigned long long key = 0ull;
    if (i < kvb && !keep[i])
      key = (static_cast<unsigned long long>(__float_as_uint(m[i])) << 32) | (0xffffffffu - static_cast<unsigned>(i));
    keys[i] = key;
  }
  bitonic_sort_descending(keys, sort_size);
  if (tid == 0) {
    double total = 0.0, kept = 0.0;
    int others = 0;
    for (int c = 0; c < kvb; ++c) {
      total += m[c];
      if (keep[c]) kept += m[c];
      else ++others;
    }
    const double target = static_cast<double>(p.threshold) * total;
    for (int i = 0; i < others && kept < target; ++i) {
      const int c = static_cast<int>(0xffffffffu - static_cast<unsigned>(keys[i] & 0xffffffffull));
      keep[c] = 1;
      kept += m[c];
    }
  }
  __syncthreads();
  write_kept_row(keep, kvb, p.row_blocks + row * kvb, p.row_counts + row);
}

template <typename T, int D, int S>
void launch_scores(const XAttentionParams& p, cudaStream_t stream) {
  constexpr int kSmem = (S + kStages) * kGroupTile * D * 2 + kMassTile * kMassTile * 4;
  static const cudaError_t lse_attr = cudaFuncSetAttribute(xattention_scores_kernel<T, D, S, false>,
                                                           cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  static const cudaError_t mass_attr = cudaFuncSetAttribute(xattention_scores_kernel<T, D, S, true>,
                                                            cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  (void)lse_attr;
  (void)mass_attr;
  const dim3 grid((p.groups_q + kGroupTile - 1) / kGroupTile, p.heads_q, p.batch);
  xattention_scores_kernel<T, D, S, false><<<grid, 128, kSmem, stream>>>(p);
  xattention_scores_kernel<T, D, S, true><<<grid, 128, kSmem, stream>>>(p);
}

template <typename T>
void launch_scores_typed(const XAttentionParams& p, cudaStream_t stream) {
  if (p.stride == 16)
    launch_scores<T, 64, 16>(p, stream);
  else if (p.dim == 128)
    launch_scores<T, 128, 8>(p, stream);
  else
    launch_scores<T, 64, 8>(p, stream);
}

}  // namespace

void launch_xattention_estimation(const XAttentionParams& p, DType dtype, cudaStream_t stream) {
  if (dtype == DType::kBF16)
    launch_scores_typed<__nv_bfloat16>(p, stream);
  else
    launch_scores_typed<__half>(p, stream);
  int sort_size = 1;
  while (sort_size < p.kv_blocks) sort_size <<= 1;
  const size_t smem = sort_size * sizeof(unsigned long long) + p.kv_blocks;
  static const cudaError_t attribute_status = cudaFuncSetAttribute(
      select_threshold_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 4096 * (sizeof(unsigned long long) + 1));
  (void)attribute_status;
  select_threshold_rows_kernel<<<dim3(p.q_blocks, p.heads_q, p.batch), kSelectThreads, smem, stream>>>(p, sort_size);
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads_q * p.q_blocks;
  launch_rows_to_csr(p.row_blocks, p.row_counts, rows, p.kv_blocks, p.indptr, p.indices, stream);
}

}  // namespace tessel::cuda::detail
