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

#include "attention_entry_points.inc"

}  // namespace tessel::cpu
