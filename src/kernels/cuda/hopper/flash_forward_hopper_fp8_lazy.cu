// The Hopper kernel's FP8 variants with lazy rescaling and the MUFU exp2 (with and without
// ping-pong), apart from flash_forward_hopper_fp8.cu so that they compile in parallel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/hopper/flash_forward_hopper_launch.cuh"

namespace tessel::cuda::detail {
TESSEL_INSTANTIATE_HOPPER_FP8(, false, true, false);
TESSEL_INSTANTIATE_HOPPER_FP8(, false, true, true);
}  // namespace tessel::cuda::detail
