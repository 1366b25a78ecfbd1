// Device merge of two partial attention states (internal launcher; checks live in attention_cuda.cc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tessel/core/dtype.h"

namespace tessel::cuda::detail {

struct MergeParams {
  const void* out_a;
  const void* out_b;
  void* out;
  const float* lse_a;
  const float* lse_b;
  float* lse;  // may be nullptr
  DType dtype_a, dtype_b, dtype_out;
  int64_t batch, seq, heads, head_dim;  // all tensors contiguous
};

void launch_merge_attention_states(const MergeParams& params, cudaStream_t stream);

}  // namespace tessel::cuda::detail
