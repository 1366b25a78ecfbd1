// Dense flash forward: the shared kernel walking a contiguous range of key tiles.
#include "cuda/flash_forward_launch.cuh"

namespace tessel::cuda::detail {

void launch_flash_forward_dense(const FlashParams& params, DType dtype, int head_dim, int batch, cudaStream_t stream) {
  const bool bf16 = dtype == DType::kBF16;
  if (head_dim == 128) {
    bf16 ? launch_flash_forward<__nv_bfloat16, 128, 2, false>(params, batch, stream)
         : launch_flash_forward<__half, 128, 2, false>(params, batch, stream);
  } else {
    bf16 ? launch_flash_forward<__nv_bfloat16, 64, 2, false>(params, batch, stream)
         : launch_flash_forward<__half, 64, 2, false>(params, batch, stream);
  }
}

}  // namespace tessel::cuda::detail
