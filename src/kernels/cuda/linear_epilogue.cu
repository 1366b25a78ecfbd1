#include "cuda/linear_epilogue.h"

#include <cuda_bf16.h>

#include <type_traits>

#include "tessel/core/error.h"
#include "tessel/kernels/cuda/launch_check.h"

namespace tessel::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ float load(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(p[i]);
  else
    return p[i];
}

template <typename T>
__device__ __forceinline__ void store(T* p, int64_t i, float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    p[i] = __float2bfloat16(v);
  else
    p[i] = v;
}

// cuBLASLt's GELU epilogue formula: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

template <typename T>
__global__ void linear_epilogue_kernel(T* y, const T* bias, int64_t count, int64_t n, bool gelu) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = load(y, i);
    if (bias != nullptr) v += load(bias, i % n);
    if (gelu) v = gelu_tanh(v);
    store(y, i, v);
  }
}

}  // namespace

void launch_linear_epilogue(void* y, DType y_type, const void* bias, int64_t m, int64_t n, bool gelu, cudaStream_t stream) {
  const int64_t count = m * n;
  if (count == 0 || (bias == nullptr && !gelu)) return;
  const int64_t wanted = (count + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(wanted < 65536 ? wanted : 65536);
  if (y_type == DType::kBF16)
    linear_epilogue_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(y), static_cast<const __nv_bfloat16*>(bias),
                                                            count, n, gelu);
  else if (y_type == DType::kF32)
    linear_epilogue_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<float*>(y), static_cast<const float*>(bias), count, n, gelu);
  else
    fail_argument("linear epilogue output type", "bf16 or fp32", dtype_name(y_type));
  check_launch("linear epilogue (bias / GELU-tanh)");
}

}  // namespace tessel::cuda
