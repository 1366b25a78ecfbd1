// The Hopper forward kernel's FP8 mode (head dim 128; bf16 and fp16 output, dense and block-sparse).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/hopper/flash_forward_hopper_launch.cuh"

namespace tessel::cuda::detail {

template <typename T>
void launch_flash_forward_hopper_fp8_typed(const FlashParams& params, bool sparse, int batch, int heads_kv,
                                           const WorkOrder& order, const Fp8Operands& operands, cudaStream_t stream) {
  const DType dtype = std::is_same_v<T, __nv_bfloat16> ? DType::kBF16 : DType::kF16;
  sparse ? launch_hopper_kernel<T, 128, true, true>(params, batch, heads_kv, dtype, order, stream, &operands)
         : launch_hopper_kernel<T, 128, false, true>(params, batch, heads_kv, dtype, order, stream, &operands);
}

template void launch_flash_forward_hopper_fp8_typed<__nv_bfloat16>(const FlashParams&, bool, int, int, const WorkOrder&,
                                                                   const Fp8Operands&, cudaStream_t);
template void launch_flash_forward_hopper_fp8_typed<__half>(const FlashParams&, bool, int, int, const WorkOrder&,
                                                            const Fp8Operands&, cudaStream_t);

}  // namespace tessel::cuda::detail
