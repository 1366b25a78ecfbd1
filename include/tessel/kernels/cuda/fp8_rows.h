// Row-wise FP8 (e4m3) quantization for the FP8 linear layers (CublasLtGemm::linear_fp8): each row
// of a row-major (rows, cols) matrix gets its own fp32 scale = absmax / 448 (an all-zero row gets
// 1), and its values x * (448 / absmax) rounded to nearest e4m3, saturating. Rows are a weight's
// output channels (quantised once at load) or an activation's tokens (quantised on the fly before
// each GEMM that reads them): per-channel x per-token scaling, so one outlier channel or token
// costs its own row's precision only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tessel/core/dtype.h"

namespace tessel::cuda {

// e4m3's largest finite value: a row's absolute maximum maps to it.
inline constexpr float kFp8E4M3Max = 448.0f;

// What a row's values are multiplied by before rounding to e4m3 (its absmax maps to 448), and the
// scale that undoes it; an all-zero row gets 1 for both. Kernels that quantise a row they produce
// (the Wan LayerNorm) use these so their bytes equal launch_quantize_rows_fp8's.
__host__ __device__ inline float fp8_row_factor(float absmax) { return absmax > 0.f ? kFp8E4M3Max / absmax : 1.f; }
__host__ __device__ inline float fp8_row_scale(float absmax) { return absmax > 0.f ? absmax / kFp8E4M3Max : 1.f; }

// x (rows, cols) bf16 or fp32 (x_type), contiguous -> q (rows, cols) e4m3 bytes and scales (rows)
// fp32, on `stream`. cols must be a multiple of 8 (vectorised loads); rows may be anything >= 0.
// Throws Error for another input type or cols.
void launch_quantize_rows_fp8(const void* x, DType x_type, int64_t rows, int64_t cols, uint8_t* q, float* scales,
                              cudaStream_t stream);

}  // namespace tessel::cuda
