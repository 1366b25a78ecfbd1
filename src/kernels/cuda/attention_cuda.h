// Internal: the CUDA implementations behind include/tessel/kernels/attention.h.
// src/kernels/attention.cc validates shapes/dtypes/devices, then calls these for CUDA tensors
// (only when built with TESSEL_WITH_CUDA). They add CUDA-specific checks (alignment, head dims)
// and launch on ctx.stream without synchronizing with the host.
#pragma once

#include "tessel/core/tensor.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/block_mask_view.h"

namespace tessel::cuda {

#include "attention_entry_points.inc"

// Workspace bytes block_sparse_attention_forward uses on CUDA (the Hopper kernel's longest-first
// work order); it runs without them, in a static order, when ctx.workspace is short.
size_t block_sparse_attention_workspace_bytes(const AttentionDims& dims);
// Workspace bytes of FP8 calls (AttentionPrecision::kFp8), dense or block-sparse: the schedule's
// room, then the quantized q, k, v and their scales. FP8 calls throw Error without them.
size_t fp8_attention_workspace_bytes(const AttentionDims& dims);
// attention.h's fp8_attention_query_key on a CUDA device.
Fp8QueryKey fp8_attention_query_key(const ExecContext& ctx, Device device, const AttentionDims& dims);

}  // namespace tessel::cuda
