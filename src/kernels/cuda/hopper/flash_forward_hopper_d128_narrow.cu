// The Hopper forward kernel's narrow-stage variants for head dim 128 (64-key stages, with and without
// ping-pong; bf16 and fp16, dense and block-sparse), apart from flash_forward_hopper_d128.cu so that
// the two compile in parallel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/hopper/flash_forward_hopper_launch.cuh"

namespace tessel::cuda::detail {
TESSEL_INSTANTIATE_HOPPER_NARROW(128);
}  // namespace tessel::cuda::detail
