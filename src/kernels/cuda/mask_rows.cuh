// Device helpers shared by the mask estimators: reductions, a CTA-wide scan and bitonic sort,
// and the two launches that turn fixed-capacity rows (ids ascending + counts) into a CSR
// (indptr by a device scan, indices compacted) with no host synchronization.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tessel::cuda::detail {

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Exclusive scan of one value per thread over the CTA (blockDim.x a multiple of 32, <= 1024), in a
// fixed order (floating-point sums are the same on every run); *total gets the sum of all values.
template <typename T>
__device__ __forceinline__ T block_exclusive_scan(T value, T* total) {
  __shared__ T s_warp[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  T inclusive = value;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += y;
  }
  // The lane before's inclusive sum (not inclusive - value, which rounds differently for floats).
  const T up = __shfl_up_sync(0xffffffffu, inclusive, 1);
  const T exclusive_in_warp = lane == 0 ? T(0) : up;
  if (lane == 31) s_warp[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    T w = lane < warps ? s_warp[lane] : T(0);
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const T y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    if (lane < warps) s_warp[lane] = w;  // inclusive prefix over warps
  }
  __syncthreads();
  const T warp_offset = warp == 0 ? T(0) : s_warp[warp - 1];
  *total = s_warp[warps - 1];
  const T result = warp_offset + exclusive_in_warp;
  __syncthreads();  // s_warp may be reused by the next call
  return result;
}

// Writes the ids of the kept columns of one row (keep[c] != 0, c < kv_blocks) in ascending order
// into `row_ids` and their count into *row_count. Every thread of the CTA must call it after the
// keep flags are final (a __syncthreads() before); each thread compacts a contiguous chunk.
__device__ __forceinline__ void write_kept_row(const uint8_t* keep, int kv_blocks, int32_t* row_ids, int32_t* row_count) {
  const int tid = threadIdx.x;
  const int chunk = (kv_blocks + blockDim.x - 1) / blockDim.x;
  const int c0 = min(kv_blocks, tid * chunk), c1 = min(kv_blocks, c0 + chunk);
  int count = 0;
  for (int c = c0; c < c1; ++c) count += keep[c];
  int row_total = 0;
  int offset = block_exclusive_scan(count, &row_total);
  for (int c = c0; c < c1; ++c)
    if (keep[c]) row_ids[offset++] = c;
  if (tid == 0) *row_count = row_total;
}

// Sets keep[c] for the kv blocks holding the diagonal of q block r, aligned bottom-right (query i
// faces key i + seq_kv - seq_q, as causal attention with a longer kv aligns them). The CTA's
// threads share the blocks; the caller synchronizes before reading keep.
__device__ __forceinline__ void keep_diagonal_blocks(uint8_t* keep, int r, int seq_q, int seq_kv, int block_q,
                                                     int block_kv) {
  const int shift = seq_kv - seq_q;
  const int q_lo = r * block_q, q_hi = min(seq_q, q_lo + block_q) - 1;
  if (q_hi + shift < 0 || q_lo + shift >= seq_kv) return;
  const int lo = min(max(q_lo + shift, 0), seq_kv - 1), hi = min(max(q_hi + shift, 0), seq_kv - 1);
  for (int c = lo / block_kv + static_cast<int>(threadIdx.x); c <= hi / block_kv; c += blockDim.x) keep[c] = 1;
}

// Sorts n (a power of two) 64-bit keys in shared memory, descending; all threads of the CTA call it.
__device__ __forceinline__ void bitonic_sort_descending(unsigned long long* keys, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {
          const bool descending = (i & size) == 0;
          const unsigned long long a = keys[i], c = keys[j];
          if ((a < c) == descending) {
            keys[i] = c;
            keys[j] = a;
          }
        }
      }
    }
  }
  __syncthreads();
}

// indptr = exclusive scan of the row counts (one CTA; each thread sums a contiguous run of rows).
static __global__ void scan_rows_kernel(const int32_t* counts, int64_t rows, int32_t* indptr) {
  const int64_t per_thread = (rows + blockDim.x - 1) / blockDim.x;
  const int64_t r0 = ::min(rows, static_cast<int64_t>(threadIdx.x) * per_thread);
  const int64_t r1 = ::min(rows, r0 + per_thread);
  int local = 0;
  for (int64_t r = r0; r < r1; ++r) local += counts[r];
  int total = 0;
  int offset = block_exclusive_scan(local, &total);
  for (int64_t r = r0; r < r1; ++r) {
    indptr[r] = offset;
    offset += counts[r];
  }
  if (threadIdx.x == 0) indptr[rows] = total;
}

static __global__ void compact_rows_kernel(const int32_t* row_blocks, const int32_t* counts, const int32_t* indptr,
                                    int kv_blocks, int32_t* indices) {
  const int64_t row = blockIdx.x;
  const int n = counts[row];
  const int32_t* src = row_blocks + row * kv_blocks;
  int32_t* dst = indices + indptr[row];
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

static inline void launch_rows_to_csr(const int32_t* row_blocks, const int32_t* counts, int64_t rows, int kv_blocks,
                              int32_t* indptr, int32_t* indices, cudaStream_t stream) {
  scan_rows_kernel<<<1, 1024, 0, stream>>>(counts, rows, indptr);
  compact_rows_kernel<<<static_cast<unsigned>(rows), 128, 0, stream>>>(row_blocks, counts, indptr, kv_blocks, indices);
}

}  // namespace tessel::cuda::detail
