#include "cuda/linear_epilogue.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "tessel/core/error.h"
#include "tessel/kernels/cuda/launch_check.h"

namespace tessel::cuda {
namespace {

constexpr int kThreads = 256;
// Elements per thread of the vectorised bf16 kernel: one 16-byte load and store.
constexpr int kVector = 8;

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

struct EpilogueArgs {
  const float* row_scales;
  const float* col_scales;
  bool gelu;
};

template <typename T>
__device__ __forceinline__ float finish(float v, int64_t row, int64_t col, const T* bias, const EpilogueArgs& args) {
  if (args.row_scales != nullptr) v *= __ldg(args.row_scales + row);
  if (args.col_scales != nullptr) v *= __ldg(args.col_scales + col);
  if (bias != nullptr) v += load(bias, col);
  return args.gelu ? gelu_tanh(v) : v;
}

// Any shape and type, one element per thread and step.
template <typename T>
__global__ void linear_epilogue_kernel(T* y, const T* bias, int64_t count, int64_t n, EpilogueArgs args) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store(y, i, finish(load(y, i), i / n, i % n, bias, args));
}

// bf16 rows of a multiple of kVector elements on 16-byte aligned storage: eight elements per
// thread and step, so the pass runs at memory bandwidth (it reads and writes every output once).
__global__ void linear_epilogue_bf16x8_kernel(__nv_bfloat16* y, const __nv_bfloat16* bias, int64_t vectors, int64_t n,
                                              EpilogueArgs args) {
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t first = v * kVector, row = first / n, col = first % n;
    uint4 bits = reinterpret_cast<const uint4*>(y)[v];
    auto* pairs = reinterpret_cast<__nv_bfloat162*>(&bits);
#pragma unroll
    for (int p = 0; p < kVector / 2; ++p) {
      const float2 in = __bfloat1622float2(pairs[p]);
      pairs[p] = __floats2bfloat162_rn(finish(in.x, row, col + 2 * p, bias, args), finish(in.y, row, col + 2 * p + 1, bias, args));
    }
    reinterpret_cast<uint4*>(y)[v] = bits;
  }
}

unsigned blocks_for(int64_t work) {
  const int64_t wanted = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(wanted < 65536 ? wanted : 65536);
}

}  // namespace

void launch_linear_epilogue(void* y, DType y_type, const void* bias, int64_t m, int64_t n, bool gelu, cudaStream_t stream,
                            const float* row_scales, const float* col_scales) {
  const int64_t count = m * n;
  if (count == 0 || (bias == nullptr && !gelu && row_scales == nullptr && col_scales == nullptr)) return;
  const EpilogueArgs args{row_scales, col_scales, gelu};
  if (y_type == DType::kBF16) {
    auto* out = static_cast<__nv_bfloat16*>(y);
    const auto* b = static_cast<const __nv_bfloat16*>(bias);
    if (n % kVector == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0)
      linear_epilogue_bf16x8_kernel<<<blocks_for(count / kVector), kThreads, 0, stream>>>(out, b, count / kVector, n, args);
    else
      linear_epilogue_kernel<<<blocks_for(count), kThreads, 0, stream>>>(out, b, count, n, args);
  } else if (y_type == DType::kF32) {
    linear_epilogue_kernel<<<blocks_for(count), kThreads, 0, stream>>>(static_cast<float*>(y), static_cast<const float*>(bias), count,
                                                                      n, args);
  } else {
    fail_argument("linear epilogue output type", "bf16 or fp32", dtype_name(y_type));
  }
  check_launch("linear epilogue (scales / bias / GELU-tanh)");
}

}  // namespace tessel::cuda
