// Internal: device kernels of the XAttention (threshold) mask estimator, definition in
// include/tessel/sparse/estimators/xattention_estimator.h. Launches on one stream, no host
// synchronization: strided antidiagonal scores on the tensor cores in two passes (row
// log-sum-exp, then softmax block masses), per-row threshold selection, then indptr and indices.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tessel/core/dtype.h"

namespace tessel::cuda::detail {

struct XAttentionParams {
  const void* q;
  const void* k;
  int64_t q_stride_b, q_stride_s, q_stride_h;
  int64_t k_stride_b, k_stride_s, k_stride_h;
  int batch, seq_q, seq_kv, heads_q, heads_kv, dim, stride;
  int groups_q, groups_kv;  // ceil(S / stride)
  int block_q, block_kv, q_blocks, kv_blocks;
  float logit_scale_log2;  // scale / stride * log2(e)
  float threshold;
  bool keep_diagonal, keep_first;
  // Workspace (device).
  float* row_lse2;      // (B, Hq, groups_q), log2 domain
  float* mass;          // (B, Hq, Qb, KVb)
  int32_t* row_counts;  // (B * Hq * Qb)
  int32_t* row_blocks;  // (B * Hq * Qb, KVb)
  // Output (device): indptr (rows + 1), indices (capacity rows * KVb).
  int32_t* indptr;
  int32_t* indices;
};

// dtype kBF16 or kF16; (stride, dim) in {(8, 64), (8, 128), (16, 64)}; 64 * stride a multiple of
// block_q and block_kv; kv_blocks at most 4096.
void launch_xattention_estimation(const XAttentionParams& params, DType dtype, cudaStream_t stream);

}  // namespace tessel::cuda::detail
