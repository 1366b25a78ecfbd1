// CUDA builds only: device kernels of the XAttention (threshold) mask estimator, definition in
// include/tessel/sparse/estimators/xattention_estimator.h. Launches on one stream, no host
// synchronization.
//
// One pass over the strided antidiagonal scores A[g][g'] = Σ_i q[gS + S-1-i] · k[g'S + i] (a GEMM
// with inner size S·D) on the tensor cores; its epilogue keeps, for every group row g and kv
// block c, the log-sum-exp (log2 domain) of the row's scaled scores inside block c. A row's
// softmax mass in block c is then exp2(block_lse2[g][c] - logsumexp2_c(block_lse2[g][·])), exact
// without a second pass over the scores. A small kernel sums those masses over the rows of each
// query block; a third selects blocks per row by threshold.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tessel/core/dtype.h"

namespace tessel::cuda::detail {

// Which tensor-core GEMM computes the scores. kAuto: wgmma (kWgmma128) on compute capability 9.0
// devices when the build includes sm_90a, mma.sync otherwise. The others force one (tests and
// benchmarks compare them); forcing wgmma where it cannot run is an error.
enum class XAttentionGemm { kAuto, kMmaSync, kWgmma128, kWgmma256 };

struct XAttentionParams {
  const void* q;  // (B, S_q, H_q, D) bf16/fp16, unit stride along D, rows 16-byte aligned
  const void* k;  // (B, S_kv, H_kv, D)
  int64_t q_stride_b, q_stride_s, q_stride_h;
  int64_t k_stride_b, k_stride_s, k_stride_h;
  int batch, seq_q, seq_kv, heads_q, heads_kv, dim, stride;
  // Group rows/columns scored: ceil(S / stride). A group that runs past the sequence is scored
  // with zeros in place of the missing tokens (the CPU estimator's definition). Callers that
  // score whole groups only pass seq rounded down to a multiple of stride.
  int groups_q, groups_kv;
  int block_q, block_kv, q_blocks, kv_blocks;
  float logit_scale_log2;  // scale / stride * log2(e)
  // Optional (nullptr: all groups of every block are valid): kv_valid_groups[c] = number of
  // leading groups of kv block c that are scored; the rest of the block is excluded from the
  // softmax (a partially filled block of an offloaded KV cache).
  const int32_t* kv_valid_groups;
  XAttentionGemm gemm = XAttentionGemm::kAuto;
  // Zero key groups of the official padding (XAttentionPadding::kChunk; all 0 without it): they
  // join every row's softmax with logit 0. zero_groups_last_block of them lie in the last kv block,
  // the others fill pad_blocks padding blocks past it (block_kv / stride each, the last holding
  // zero_groups_last_pad), which take part in the selection only.
  int zero_groups_total, zero_groups_last_block, pad_blocks, zero_groups_last_pad;
  // Workspace (device, with zero groups): per (b, h, q block), the summed probability of one zero
  // group over the block's group rows.
  float* zero_group_mass;
  // Selection (launch_xattention_estimation only). head_threshold (optional, device array of
  // heads_q; nullptr: threshold for every head): query head h selects with head_threshold[h], as
  // the CPU estimator's per_head_threshold.
  float threshold;
  const float* head_threshold = nullptr;
  bool keep_diagonal, keep_first;
  // Workspace (device): block_lse2 (B, H_q, groups_q, kv_blocks), xattention_block_lse_floats().
  float* block_lse2;
  // Output of launch_xattention_block_mass (device): mass (B, H_q, q_blocks, kv_blocks), the sum
  // over the group rows of each query block of their softmax mass in each kv block (each row's
  // masses sum to 1 over the valid columns).
  float* mass;
  // Selection workspace and output (launch_xattention_estimation only).
  int32_t* row_counts;  // (B * H_q * q_blocks)
  int32_t* row_blocks;  // (B * H_q * q_blocks, kv_blocks)
  int32_t* indptr;      // rows + 1
  int32_t* indices;     // capacity rows * kv_blocks
};

// Elements of the block_lse2 workspace.
inline int64_t xattention_block_lse_floats(const XAttentionParams& p) {
  return static_cast<int64_t>(p.batch) * p.heads_q * p.groups_q * p.kv_blocks;
}

// The caller checks the limits first: tessel::xattention_device_limit (device_mask_estimation.h).

// Scores and per-query-block masses (p.mass); no selection. dtype kBF16 or kF16.
void launch_xattention_block_mass(const XAttentionParams& params, DType dtype, cudaStream_t stream);

// Masses, then per (b, h, q block) threshold selection (forced diagonal, then by mass descending
// until threshold × total, padding blocks included; then block 0 if keep_first), then the CSR
// indptr and indices.
void launch_xattention_estimation(const XAttentionParams& params, DType dtype, cudaStream_t stream);

}  // namespace tessel::cuda::detail
