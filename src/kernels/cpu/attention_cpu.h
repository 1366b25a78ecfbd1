// Internal: the CPU kernels behind include/tessel/kernels/attention.h. Arguments are already
// validated by src/kernels/attention.cc (CPU tensors, matching shapes, head_dim stride 1).
#pragma once

#include "tessel/core/tensor.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/block_mask_view.h"

namespace tessel::cpu {

// Workspace bytes attention_forward / block_sparse_attention_forward take on `threads` threads for
// k/v of seq_kv tokens (any seq_q), with masks of kv blocks of at least mask_block_kv tokens
// (0: dense only).
size_t workspace_bytes(int threads, int64_t batch, int64_t seq_kv, int64_t heads, int64_t kv_heads, int64_t head_dim,
                       int64_t mask_block_kv);

void attention_forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                       const TensorView& lse, const AttentionOptions& options);
void block_sparse_attention_forward(const ExecContext& ctx, const TensorView& q, const TensorView& k,
                                    const TensorView& v, const BlockMaskView& mask, const TensorView& out, const TensorView& lse,
                                    const AttentionOptions& options);
void merge_attention_states(const ExecContext& ctx, const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                            const TensorView& lse_b, const TensorView& out, const TensorView& lse);

}  // namespace tessel::cpu
