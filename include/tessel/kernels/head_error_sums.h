// Per-head sums that compare an approximate attention output with a reference: the inputs of each
// head's rel-L2 (√(diff / reference)) and cosine (dot / √(reference · approx)). Calibration scores
// every head of a block-sparse output at once with them, on the device where the outputs are.
#pragma once

#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"

namespace tessel {

// For query head h of (B, S, H, D) outputs, over every (batch, token, dim) element of that head:
// diff = Σ (a − r)², reference = Σ r², approx = Σ a², dot = Σ a · r. Each vector has H entries.
struct HeadErrorSums {
  std::vector<double> diff, reference, approx, dot;
};

// approx and reference: contiguous, one shape of rank 4, on one device. CPU: fp32, each head summed
// in fp64 in element order (one task per head). CUDA: bf16, fp16 or fp32 (the two may differ),
// fp64 partial sums per (chunk of tokens, head) in a fixed order, totalled on the host: the call
// synchronizes with ctx.stream to return them. Throws Error on other shapes, dtypes or devices.
HeadErrorSums head_error_sums(const ExecContext& ctx, const TensorView& approx, const TensorView& reference);

}  // namespace tessel
