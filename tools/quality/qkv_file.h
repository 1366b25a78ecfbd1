// Captured attention inputs for quality evaluation: a safetensors file with tensors "q", "k", "v"
// in BSHD layout (fp32, fp16 or bf16), e.g. dumped from one attention layer of a real model.
#pragma once

#include <string>

#include "tessel/core/tensor.h"

namespace tessel {

struct QkvTensors {
  Tensor q, k, v;
};

// Throws Error naming the file and tensor when one is missing, not rank 4, of another dtype, or
// inconsistent (batch / head_dim differ, k and v shapes differ, H_q not a multiple of H_kv), or
// holds NaN or infinities (named with the count and the first position).
QkvTensors load_qkv_safetensors(const std::string& path);

}  // namespace tessel
