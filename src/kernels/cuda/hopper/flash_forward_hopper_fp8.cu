// The Hopper forward kernel's FP8 mode (head dim 128; bf16 and fp16 output, dense and block-sparse):
// the dispatch over the FP8 variants (kernel_variant.h) and the default kernel's instantiations;
// the other kernel combinations are in flash_forward_hopper_fp8_{poly,lazy}.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/hopper/flash_forward_hopper_launch.cuh"

namespace tessel::cuda::detail {

TESSEL_INSTANTIATE_HOPPER_FP8(, false, false, false);
TESSEL_INSTANTIATE_HOPPER_FP8(extern, true, false, false);
TESSEL_INSTANTIATE_HOPPER_FP8(extern, true, true, false);
TESSEL_INSTANTIATE_HOPPER_FP8(extern, false, true, false);
TESSEL_INSTANTIATE_HOPPER_FP8(extern, false, true, true);

template <typename T>
void launch_flash_forward_hopper_fp8_typed(const FlashParams& params, bool sparse, int batch, int heads_kv,
                                           const WorkOrder& order, const Fp8Operands& operands,
                                           const HopperFp8Variant& variant, cudaStream_t stream) {
  const bool smooth = variant.smooth_k;
  if (variant.ping_pong) {
    // Ping-pong is instantiated with lazy rescaling only (the combination hopper_fp8_variants lists).
    if (variant.poly_exp2 || !variant.lazy_rescale)
      throw Error("FP8 attention: variant " + hopper_fp8_variant_name(variant) + " has no instantiation");
    return launch_hopper_fp8_kernel<T, false, true, true>(params, sparse, batch, heads_kv, order, operands, smooth, stream);
  }
  if (variant.poly_exp2)
    return variant.lazy_rescale
               ? launch_hopper_fp8_kernel<T, true, true, false>(params, sparse, batch, heads_kv, order, operands, smooth, stream)
               : launch_hopper_fp8_kernel<T, true, false, false>(params, sparse, batch, heads_kv, order, operands, smooth, stream);
  return variant.lazy_rescale
             ? launch_hopper_fp8_kernel<T, false, true, false>(params, sparse, batch, heads_kv, order, operands, smooth, stream)
             : launch_hopper_fp8_kernel<T, false, false, false>(params, sparse, batch, heads_kv, order, operands, smooth, stream);
}

template void launch_flash_forward_hopper_fp8_typed<__nv_bfloat16>(const FlashParams&, bool, int, int, const WorkOrder&,
                                                                   const Fp8Operands&, const HopperFp8Variant&,
                                                                   cudaStream_t);
template void launch_flash_forward_hopper_fp8_typed<__half>(const FlashParams&, bool, int, int, const WorkOrder&,
                                                            const Fp8Operands&, const HopperFp8Variant&, cudaStream_t);

}  // namespace tessel::cuda::detail
