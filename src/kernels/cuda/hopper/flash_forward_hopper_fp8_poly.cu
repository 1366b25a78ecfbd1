// The Hopper kernel's FP8 variants with the polynomial exp2 (with and without lazy rescaling),
// apart from flash_forward_hopper_fp8.cu so that they compile in parallel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/hopper/flash_forward_hopper_launch.cuh"

namespace tessel::cuda::detail {
TESSEL_INSTANTIATE_HOPPER_FP8(, true, false, false);
TESSEL_INSTANTIATE_HOPPER_FP8(, true, true, false);
}  // namespace tessel::cuda::detail
