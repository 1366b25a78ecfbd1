// Launch helper shared by the dense and sparse instantiation files.
#pragma once

#include "cuda/flash_forward_kernel.cuh"

namespace tessel::cuda::detail {

template <typename T, int D, int MT, bool kSparse>
void launch_flash_forward(const FlashParams& params, int batch, cudaStream_t stream) {
  constexpr int kSmem = flash_forward_smem_bytes<D, MT, kSparse>();
  auto kernel = flash_forward_kernel<T, D, MT, kSparse>;
  // Above 48 KB a kernel must opt in; done once per instantiation (cheap and graph-safe after).
  static const cudaError_t attribute_status =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  (void)attribute_status;
  const dim3 grid((params.seq_q + 64 * MT - 1) / (64 * MT), params.heads_q, batch);
  kernel<<<grid, 128, kSmem, stream>>>(params);
}

}  // namespace tessel::cuda::detail
