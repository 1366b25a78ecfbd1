// Internal: the CUDA implementations behind include/tessel/kernels/attention.h.
// src/kernels/attention.cc validates shapes/dtypes/devices, then calls these for CUDA tensors
// (only when built with TESSEL_WITH_CUDA). They add CUDA-specific checks (alignment, head dims)
// and launch on ctx.stream without synchronizing with the host.
#pragma once

#include "tessel/core/tensor.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/block_mask_view.h"

namespace tessel::cuda {

void attention_forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                       const TensorView& lse, const AttentionOptions& options);
void block_sparse_attention_forward(const ExecContext& ctx, const TensorView& q, const TensorView& k,
                                    const TensorView& v, const BlockMaskView& mask, const TensorView& out, const TensorView& lse,
                                    const AttentionOptions& options);
void merge_attention_states(const ExecContext& ctx, const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                            const TensorView& lse_b, const TensorView& out, const TensorView& lse);

}  // namespace tessel::cuda
