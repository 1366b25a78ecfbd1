// Internal: the warp-specialized Hopper forward kernel (flash_forward_hopper_kernel.cuh) for
// dense and block-sparse attention. attention_cuda.cc selects it when flash_forward_hopper_fits()
// holds and keeps the sm_80 kernel (flash_forward_kernel.cuh) for everything else.
#pragma once

#include <cuda_runtime.h>

#include "cuda/flash_params.h"
#include "cuda/hopper/fp8_operands.h"
#include "cuda/hopper/kernel_variant.h"
#include "cuda/hopper/work_items.h"
#include "tessel/core/dtype.h"

namespace tessel::cuda::detail {

// True on a compute capability 9.0 device of a build with sm_90a code, for head dim 64, 96, 128, 192
// or 256 and,
// for a block mask, query blocks that are a multiple of the kernel's 128 rows.
bool flash_forward_hopper_fits(int head_dim, bool sparse, int block_q);

// Launches on `stream`; params as for launch_flash_forward_dense/_sparse (flash_params.h), dtype
// kBF16 or kF16. batch and heads_kv complete the shapes the tensor maps describe. A block mask's
// items run longest first when `order` has memory (work_order.h), in a static order otherwise.
// `variant` (kernel_variant.h) picks the tile shape and ping-pong where the head dim has them.
void launch_flash_forward_hopper(const FlashParams& params, DType dtype, int head_dim, bool sparse, int batch,
                                 int heads_kv, const WorkOrder& order, const HopperVariant& variant, cudaStream_t stream);

// The FP8 mode (AttentionPrecision::kFp8; head dim 128, dtype kBF16 or kF16 in and out): quantizes
// params.q/k/v into `operands` (fp8_operands.h), then runs `variant`'s kernel on them, both on
// `stream`. Without `quantize_query_key` the operands' q and k (and scales) were written by the
// caller: only v is quantized, and `variant` runs without K smoothing.
void launch_flash_forward_hopper_fp8(const FlashParams& params, DType dtype, bool sparse, int batch, int heads_kv,
                                     const WorkOrder& order, const Fp8Operands& operands,
                                     const HopperFp8Variant& variant, bool quantize_query_key, cudaStream_t stream);

}  // namespace tessel::cuda::detail
