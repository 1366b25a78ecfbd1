// Row-wise e4m3 quantization (see tessel/kernels/cuda/fp8_rows.h): one CTA per row, two passes over
// the row (the absolute maximum, then the scaled values; the second pass reads from L2/L1).
#include "tessel/kernels/cuda/fp8_rows.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "tessel/core/error.h"
#include "tessel/kernels/cuda/launch_check.h"

namespace tessel::cuda {
namespace {

constexpr int kRowThreads = 256;

template <typename T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x);
  else
    return x;
}

// Threads move 8 elements at a time (16 bytes of bf16, 32 of fp32; cols % 8 == 0 keeps rows aligned).
template <typename T>
struct alignas(8 * sizeof(T)) Eight {
  T v[8];
};

template <typename T>
__global__ void __launch_bounds__(kRowThreads) quantize_rows_kernel(const T* x, int64_t cols, uint8_t* q, float* scales) {
  const int64_t row = blockIdx.x;
  const Eight<T>* in = reinterpret_cast<const Eight<T>*>(x + row * cols);
  const int64_t chunks = cols / 8;
  float absmax = 0.f;
  for (int64_t c = threadIdx.x; c < chunks; c += kRowThreads) {
    const Eight<T> chunk = in[c];
#pragma unroll
    for (int e = 0; e < 8; ++e) absmax = fmaxf(absmax, fabsf(to_float(chunk.v[e])));
  }
  __shared__ float warp_max[kRowThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, offset));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = absmax;
  __syncthreads();
  absmax = warp_max[0];
#pragma unroll
  for (int w = 1; w < kRowThreads / 32; ++w) absmax = fmaxf(absmax, warp_max[w]);
  // The host reference (tests) computes the same two fp32 operations: 448 / absmax, then x * factor.
  const float factor = fp8_row_factor(absmax);
  if (threadIdx.x == 0) scales[row] = fp8_row_scale(absmax);
  uint2* out = reinterpret_cast<uint2*>(q + row * cols);
  for (int64_t c = threadIdx.x; c < chunks; c += kRowThreads) {
    const Eight<T> chunk = in[c];
    uint32_t packed[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t word = 0;
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        const int e = half * 4 + pair * 2;
        const __nv_fp8x2_storage_t two = __nv_cvt_float2_to_fp8x2(
            make_float2(to_float(chunk.v[e]) * factor, to_float(chunk.v[e + 1]) * factor), __NV_SATFINITE, __NV_E4M3);
        word |= static_cast<uint32_t>(two) << (16 * pair);
      }
      packed[half] = word;
    }
    out[c] = make_uint2(packed[0], packed[1]);
  }
}

}  // namespace

void launch_quantize_rows_fp8(const void* x, DType x_type, int64_t rows, int64_t cols, uint8_t* q, float* scales,
                              cudaStream_t stream) {
  if (cols <= 0 || cols % 8 != 0) fail_argument("FP8 row quantization cols", "a positive multiple of 8", cols);
  if (rows < 0) fail_argument("FP8 row quantization rows", ">= 0", rows);
  if (rows == 0) return;
  if (rows > 0x7fffffff) fail_argument("FP8 row quantization rows", "< 2^31", rows);
  const dim3 grid(static_cast<unsigned>(rows));
  switch (x_type) {
    case DType::kBF16:
      quantize_rows_kernel<<<grid, kRowThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), cols, q, scales);
      break;
    case DType::kF32:
      quantize_rows_kernel<<<grid, kRowThreads, 0, stream>>>(static_cast<const float*>(x), cols, q, scales);
      break;
    default:
      fail_argument("FP8 row quantization input type", "bf16 or fp32", dtype_name(x_type));
  }
  check_launch("FP8 row quantization");
}

}  // namespace tessel::cuda
