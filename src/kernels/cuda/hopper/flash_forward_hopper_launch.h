// Internal: what flash_forward_hopper.cu (the dispatch) and the per-head-dim launch files share.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/flash_params.h"
#include "cuda/hopper/fp8_operands.h"
#include "cuda/hopper/kernel_variant.h"
#include "cuda/hopper/work_items.h"
#include "tessel/core/dtype.h"

namespace tessel::cuda::detail {

// A (D, S, H, B) view of 16-bit elements as the copy engine reads it: 64 x 64 boxes, the 128-byte
// swizzle, zeros outside (tokens past S, head-dim columns past D).
CUtensorMap make_bshd_map(const void* data, DType dtype, int head_dim, int seq, int heads, int batch, int64_t stride_s,
                          int64_t stride_h, int64_t stride_b);

// The e4m3 operands of the FP8 mode (fp8_operands.h): (B, S, H, D) contiguous rows in boxes of
// 128 columns x 64 tokens (128-byte swizzle), and the transposed v (B, H, D, S_padded) in boxes of
// 64 keys x D channels (64-byte swizzle).
CUtensorMap make_fp8_token_map(const uint8_t* data, int head_dim, int seq, int heads, int batch);
CUtensorMap make_fp8_transposed_map(const uint8_t* data, int head_dim, int seq_padded, int heads, int batch);

// Launches the kernel for element type T (__nv_bfloat16 or __half), head dim D and a variant
// (ignored where the head dim has only the default); explicitly instantiated in
// flash_forward_hopper_d<D>.cu.
template <typename T, int D>
void launch_flash_forward_hopper_typed(const FlashParams& params, bool sparse, int batch, int heads_kv, DType dtype,
                                       const WorkOrder& order, const HopperVariant& variant, cudaStream_t stream);

// The FP8 mode's launch (head dim 128, output type T) of `variant`'s kernel (operands quantized
// as the variant says), instantiated in flash_forward_hopper_fp8.cu.
template <typename T>
void launch_flash_forward_hopper_fp8_typed(const FlashParams& params, bool sparse, int batch, int heads_kv,
                                           const WorkOrder& order, const Fp8Operands& operands,
                                           const HopperFp8Variant& variant, cudaStream_t stream);

}  // namespace tessel::cuda::detail
