// The Hopper forward kernel's variants for head dim 128 that store O through shared memory with the
// copy engine (with and without ping-pong; bf16 and fp16, dense and block-sparse), apart from
// flash_forward_hopper_d128.cu so that they compile in parallel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/hopper/flash_forward_hopper_launch.cuh"

namespace tessel::cuda::detail {
TESSEL_INSTANTIATE_HOPPER_TMA_STORE(128);
}  // namespace tessel::cuda::detail
