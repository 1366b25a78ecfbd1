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
  int64_t batch, seq, heads, head_dim;
  // Element strides of (batch, token, head) of out_a, out_b and out (the head dim is contiguous):
  // a ring step's rows are a token range of a batched buffer. The LSEs are contiguous (B, H, S).
  int64_t strides_a[3], strides_b[3], strides_out[3];
};

void launch_merge_attention_states(const MergeParams& params, cudaStream_t stream);

}  // namespace tessel::cuda::detail
