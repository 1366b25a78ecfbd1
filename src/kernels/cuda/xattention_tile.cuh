// Device pieces shared by the two GEMM kernels of the XAttention estimator (mma.sync for sm_80+,
// wgmma for sm_90a): which strided rows and group columns a tile scores, and the last step of the
// epilogue that combines per-unit log-sum-exps into one per (row, kv block).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/flash_forward_kernel.cuh"
#include "tessel/kernels/cuda/xattention_estimation.h"

namespace tessel::cuda::detail {

constexpr int kXAttentionSlice = 64;  // inner elements per pipeline step (one 128-byte row per group)

template <int N>
__device__ __forceinline__ void cp_async_wait_pending() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Rows j of a strided tile starting at token `first` (row j is token first + j*S) that lie
// before `seq`: the rest are zero-filled.
__device__ __forceinline__ int strided_rows_valid(int seq, int first, int stride, int tile_rows) {
  const int left = seq - first;
  return left <= 0 ? 0 : min(tile_rows, (left + stride - 1) / stride);
}

__device__ __forceinline__ float lse2_of(float max, float sum) { return max == -INFINITY ? -INFINITY : max + __log2f(sum); }

// Whether group column `col` is scored: inside the sequence and among the leading valid groups of
// its kv block (a partially filled KV-cache block excludes the rest from the softmax).
__device__ __forceinline__ bool group_column_scored(const XAttentionParams& p, int col, int block_shift) {
  if (col >= p.groups_kv) return false;
  const int group_kv_block = 1 << block_shift;
  if (p.kv_valid_groups == nullptr) return true;
  const int block = col >> block_shift;
  return block < p.kv_blocks && (col & (group_kv_block - 1)) < p.kv_valid_groups[block];
}

// Streams the GEMM's operand slices into shared memory with cp.async, one pipeline step per call:
// the kRows group rows of q from g0 (each group's tokens in reverse order: the antidiagonal) and
// the kCols group columns of k from c0, 64 inner elements each, at token offset i and d chunk. A
// cursor walks (i, d chunk) in step order, so the loop does no division; the caller moves q, k,
// g0 and c0 to its next tile when load() reports the last slice of one.
template <int kRows, int kCols, int kThreads>
struct StridedSliceLoader {
  static constexpr uint32_t kRowSliceBytes = kRows * kXAttentionSlice * 2;
  int64_t q_stride_s, k_stride_s;
  int seq_q, seq_kv, stride, slices_per_token;
  const uint16_t* q;  // the tile's head (and batch) of q and k
  const uint16_t* k;
  int g0, c0;         // first group row and group column of the tile
  int i = 0, d = 0;

  // Returns true when the slice just loaded was the tile's last (the cursor is back at its start).
  __device__ __forceinline__ bool load(uint32_t stage, int tid) {
    const int d0 = d * kXAttentionSlice;
    const int q_first = g0 * stride + stride - 1 - i;  // reversed within the group
    const int q_valid = strided_rows_valid(seq_q, q_first, stride, kRows);
    load_tile<kXAttentionSlice, kRows, kThreads>(
        stage, (q_valid > 0 ? q + static_cast<int64_t>(q_first) * q_stride_s : q) + d0, stride * q_stride_s, q_valid, tid);
    const int k_first = c0 * stride + i;
    const int k_valid = strided_rows_valid(seq_kv, k_first, stride, kCols);
    load_tile<kXAttentionSlice, kCols, kThreads>(stage + kRowSliceBytes,
                                                 (k_valid > 0 ? k + static_cast<int64_t>(k_first) * k_stride_s : k) + d0,
                                                 stride * k_stride_s, k_valid, tid);
    if (++d < slices_per_token) return false;
    d = 0;
    if (++i < stride) return false;
    i = 0;
    return true;
  }
};

// Units to blocks: s_unit holds, per tile row, the log2-sum-exp of each unit of kUnit columns
// (kUnitsPerTile of them); each thread combines the units of (row, block) pairs and writes
// out[g][c] for the rows inside groups_q and the blocks inside kv_blocks. The caller puts a
// barrier between the writes of s_unit and this call.
template <int kRows, int kUnitsPerTile, int kUnit, int kThreads>
__device__ __forceinline__ void store_tile_block_lse(const float* s_unit, const XAttentionParams& p, float* out, int g0,
                                                     int c0, int group_kv_block, int tid) {
  const int units_per_block = group_kv_block / kUnit, blocks_per_tile = kUnitsPerTile * kUnit / group_kv_block;
  const int block0 = c0 / group_kv_block;
  for (int idx = tid; idx < kRows * blocks_per_tile; idx += kThreads) {
    const int r = idx / blocks_per_tile, bl = idx % blocks_per_tile;
    if (g0 + r >= p.groups_q || block0 + bl >= p.kv_blocks) continue;
    const float* u = s_unit + r * kUnitsPerTile + bl * units_per_block;
    float mx = -INFINITY;
    for (int j = 0; j < units_per_block; ++j) mx = fmaxf(mx, u[j]);
    float sum = 0.f;
    if (mx != -INFINITY)
      for (int j = 0; j < units_per_block; ++j) sum += fast_exp2(u[j] - mx);
    out[static_cast<int64_t>(g0 + r) * p.kv_blocks + block0 + bl] = lse2_of(mx, sum);
  }
}

}  // namespace tessel::cuda::detail
