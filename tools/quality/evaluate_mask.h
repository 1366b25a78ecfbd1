// One quality measurement: run block-sparse attention with a mask (through a token permutation
// when the plan has one) and compare its output to the dense output.
#pragma once

#include <functional>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/sparse/block_mask.h"
#include "tessel/sparse/planners/ordering.h"
#include "quality/output_error.h"

namespace tessel {

struct MaskEvaluation {
  double density = 1.0;  // mask.density()
  OutputError error;     // vs `dense_out`
  double attn_ms = 0.0;  // block-sparse attention (including permute/unpermute), median of `repeats`
};

// q, k, v: CPU BSHD of one dtype; dense_out the dense attention output of q, k, v. permutation
// may be null (raster order). Throws Error on inconsistent shapes.
MaskEvaluation evaluate_mask(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dense_out,
                             const BlockMask& mask, const TokenPermutation* permutation, int repeats = 1);

// Median wall time in milliseconds of `repeats` (>= 1) calls of fn.
double median_ms(int repeats, const std::function<void()>& fn);

}  // namespace tessel
