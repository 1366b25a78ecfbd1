// Device reduction behind tessel::head_error_sums (internal launcher; checks live in
// src/kernels/head_error_sums.cc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tessel/core/dtype.h"

namespace tessel::cuda::detail {

struct HeadErrorSumsParams {
  const void* approx;
  const void* reference;
  DType approx_dtype, reference_dtype;
  int64_t rows, heads, head_dim;  // rows = B · S; contiguous (rows, heads, head_dim)
  int chunks;                     // token chunks per head
  double* partial;                // (heads, chunks, 4): diff, reference, approx, dot
};

// Token chunks the launcher uses for `rows` rows (at least 1): what `partial` must hold per head.
int head_error_sums_chunks(int64_t rows);

void launch_head_error_sums(const HeadErrorSumsParams& params, cudaStream_t stream);

}  // namespace tessel::cuda::detail
