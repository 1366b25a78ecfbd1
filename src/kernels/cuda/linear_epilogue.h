// The bias / GELU-tanh epilogue of a linear layer as a kernel of ours (internal): for a cuBLASLt
// matmul whose fused epilogue has no algorithm (FP8 with outer-vector scales on some cuBLAS
// versions), the matmul writes x · w^T alone and this adds the rest in place.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tessel/core/dtype.h"

namespace tessel::cuda {

// y (m, n) row-major, bf16 or fp32 (y_type), in place: y += bias (n, y's type; skipped when null),
// then GELU with the tanh approximation when `gelu`.
void launch_linear_epilogue(void* y, DType y_type, const void* bias, int64_t m, int64_t n, bool gelu, cudaStream_t stream);

}  // namespace tessel::cuda
