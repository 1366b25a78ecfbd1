// Internal: fp32 copies of one head's rows, the input every CPU estimator works on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/core/tensor.h"

namespace tessel::estimators {

// Checks q (B, S_q, H_q, D) and k (B, S_kv, H_kv, D): CPU, floating fp32/fp16/bf16, same B and D,
// H_q % H_kv == 0. Throws Error naming the argument.
void check_qk(const TensorView& q, const TensorView& k, const std::string& who);

// Rows [0, rows) of head h of batch b of a CPU (B, S, H, D) fp32/fp16/bf16 view (any strides), as
// a (rows, D) row-major fp32 matrix; rows past S are zero.
std::vector<float> head_rows(const TensorView& x, int64_t b, int64_t h, int64_t rows);

}  // namespace tessel::estimators
