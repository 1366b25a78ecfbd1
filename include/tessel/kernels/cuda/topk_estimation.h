// CUDA builds only: device kernels of the dynamic_topk mask estimator (definition in
// include/tessel/sparse/estimators/topk_estimator.h). Four or five launches on one stream, no host
// synchronization: K's mean over the sequence (when smoothing); pool q and k blocks; select each row's blocks into a fixed-capacity buffer;
// scan the row counts into indptr; compact the rows into indices.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tessel/core/dtype.h"

namespace tessel::cuda::detail {

// The sequence mean is summed in this many token chunks in parallel, then the chunks in order.
inline constexpr int kTopkMeanChunks = 32;

struct TopkParams {
  const void* q;
  const void* k;
  int64_t q_stride_b, q_stride_s, q_stride_h;
  int64_t k_stride_b, k_stride_s, k_stride_h;
  int batch, seq_q, seq_kv, heads_q, heads_kv, dim;
  int block_q, block_kv, q_blocks, kv_blocks;
  float scale;
  float similarity_threshold;
  int n_topk;           // top-k mode
  float cdf_threshold;  // > 0: cdf mode
  // Optional, per query head (device arrays of heads_q; nullptr: n_topk / cdf_threshold for every
  // head), as the CPU estimator's per_head option: head h keeps head_n_topk[h] blocks in top-k mode,
  // and cuts at head_cdf[h] in cdf mode (cdf_threshold > 0 still selects the mode).
  const int32_t* head_n_topk = nullptr;
  const float* head_cdf = nullptr;
  // cdf cut: true keeps the longest prefix whose sum stays <= cdf_threshold (at least one block),
  // false the shortest that reaches it.
  bool cdf_at_most;
  // A partial block or one with a zero-norm token is not self-similar.
  bool whole_blocks_only;
  bool keep_diagonal;
  int sink_blocks;
  // Workspace (device).
  // (B, Hkv, D): K's mean over the sequence, subtracted first; nullptr: no smoothing. The buffer
  // holds (1 + kTopkMeanChunks) x B x Hkv x D floats: the mean, then per-chunk partial sums.
  float* k_mean;
  float* pooled_q;       // (B, Hq, Qb, D)
  uint8_t* similar_q;    // (B, Hq, Qb)
  float* pooled_k;       // (B, Hkv, KVb, D)
  uint8_t* similar_k;    // (B, Hkv, KVb)
  int32_t* row_counts;   // (B * Hq * Qb)
  int32_t* row_blocks;   // (B * Hq * Qb, KVb): each row's kept ids, ascending, first row_counts[r] valid
  // Output (device): indptr (rows + 1), indices (capacity rows * KVb).
  int32_t* indptr;
  int32_t* indices;
};

// dtype kBF16 or kF16; dim a multiple of 32, at most 256; kv_blocks at most kTopkMaxKvBlocks.
inline constexpr int kTopkMaxKvBlocks = 4096;
void launch_topk_estimation(const TopkParams& params, DType dtype, cudaStream_t stream);

}  // namespace tessel::cuda::detail
