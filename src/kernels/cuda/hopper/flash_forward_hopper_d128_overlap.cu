// The Hopper forward kernel's variants for head dim 128 that store O through shared memory and issue
// the next item's first QK^T before the epilogue (with and without ping-pong; bf16 and fp16, dense
// and block-sparse), apart from the other files so that they compile in parallel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/hopper/flash_forward_hopper_launch.cuh"

namespace tessel::cuda::detail {
TESSEL_INSTANTIATE_HOPPER_OVERLAP(128);
}  // namespace tessel::cuda::detail
