// The Hopper forward kernel's instantiations for head dim 192 (bf16 and fp16, dense and block-sparse).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/hopper/flash_forward_hopper_launch.cuh"

namespace tessel::cuda::detail {
TESSEL_INSTANTIATE_HOPPER_LAUNCH(192);
}  // namespace tessel::cuda::detail
