// Block-sparse flash forward: the shared kernel walking the kept blocks of each mask row.
#include "cuda/flash_forward_launch.cuh"

namespace tessel::cuda::detail {

namespace {
template <typename T>
void launch_typed(const FlashParams& params, int head_dim, int block_m, int batch, cudaStream_t stream) {
  if (head_dim == 128) {
    block_m == 128 ? launch_flash_forward<T, 128, 2, true>(params, batch, stream)
                   : launch_flash_forward<T, 128, 1, true>(params, batch, stream);
  } else {
    block_m == 128 ? launch_flash_forward<T, 64, 2, true>(params, batch, stream)
                   : launch_flash_forward<T, 64, 1, true>(params, batch, stream);
  }
}
}  // namespace

void launch_flash_forward_sparse(const FlashParams& params, DType dtype, int head_dim, int block_m, int batch,
                                 cudaStream_t stream) {
  if (dtype == DType::kBF16) {
    launch_typed<__nv_bfloat16>(params, head_dim, block_m, batch, stream);
  } else {
    launch_typed<__half>(params, head_dim, block_m, batch, stream);
  }
}

}  // namespace tessel::cuda::detail
