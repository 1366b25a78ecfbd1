// Parameters of the flash forward kernel (flash_forward_kernel.cuh) and its launchers; plain
// host types so the argument checks can live in a C++ file.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tessel/core/dtype.h"

namespace tessel::cuda::detail {

inline constexpr int kNoLimit = 0x3fffffff;

struct FlashParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;  // (B, Hq, Sq) contiguous, or nullptr
  int64_t q_stride_b, q_stride_s, q_stride_h;
  int64_t k_stride_b, k_stride_s, k_stride_h;
  int64_t v_stride_b, v_stride_s, v_stride_h;
  int64_t o_stride_b, o_stride_s, o_stride_h;
  int seq_q, seq_kv, heads_q, group;  // group = Hq / Hkv
  float scale_log2;                   // scale * log2(e), > 0
  // Token visibility: key j is visible to query i iff lo(i) <= j <= hi(i), where
  // hi(i) = i + hi_offset (kNoLimit when unbounded) and lo(i) = i + lo_offset (-kNoLimit).
  int hi_offset, lo_offset;
  bool has_hi, has_lo;
  // Block-sparse only.
  const int32_t* indptr;
  const int32_t* indices;
  int mask_batch, mask_heads, mask_head_div, q_blocks, block_q, block_kv;
  int sub_shift;  // log2(block_kv / 64)
  // Optional token-level masks inside the kept blocks (block_mask_view.h's layout), or nullptr;
  // sub_block_words = block_kv / 32 words per query row of a block.
  const uint32_t* sub_block_bits;
  int sub_block_words;
  // FP8 mode of the Hopper kernel only (hopper/fp8_operands.h): q and k dequantization factors per
  // 64 tokens, (B, H_q, ceil(S_q / 64)) and (B, H_kv, ceil(S_kv / 64)), and v's channel maxima
  // (B, H_kv, D) as float bits.
  const float* fp8_q_scale;
  const float* fp8_k_scale;
  const uint32_t* fp8_v_absmax;
  // Host side only: multiprocessors the persistent launch leaves free (AttentionOptions::sm_margin).
  int sm_margin;
};

// Launch on `stream`; dtype kBF16 or kF16, head_dim 64 or 128. Dense uses 128-row CTAs; sparse
// uses block_m = 128 when the mask's block_q is a multiple of 128, else 64.
void launch_flash_forward_dense(const FlashParams& params, DType dtype, int head_dim, int batch, cudaStream_t stream);
void launch_flash_forward_sparse(const FlashParams& params, DType dtype, int head_dim, int block_m, int batch,
                                 cudaStream_t stream);

}  // namespace tessel::cuda::detail
