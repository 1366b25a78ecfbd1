// The epilogue of a linear layer as a kernel of ours (internal): for a cuBLASLt matmul whose fused
// epilogue or scale mode has no algorithm (FP8 with outer-vector scales, which CUDA 13.0's
// cuBLASLt refuses on Hopper), the matmul writes x · w^T alone and this applies the rest in place.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tessel/core/dtype.h"

namespace tessel::cuda {

// y (m, n) row-major, bf16 or fp32 (y_type), in place:
//   y[i, j] = act(y[i, j] * row_scales[i] * col_scales[j] + bias[j])
// where each of row_scales (m, fp32), col_scales (n, fp32) and bias (n, y's type) is skipped when
// null, and act is GELU with the tanh approximation when `gelu`, else the identity. The scaled
// product is formed in fp32 from y's stored value, so a bf16 y is rounded twice (once by the
// matmul, once here).
void launch_linear_epilogue(void* y, DType y_type, const void* bias, int64_t m, int64_t n, bool gelu, cudaStream_t stream,
                            const float* row_scales = nullptr, const float* col_scales = nullptr);

}  // namespace tessel::cuda
