// Helpers shared by the kv tests: row views of BSHD tensors and comparison with the fp64 reference.
#pragma once

#include <gtest/gtest.h>

#include <cmath>

#include "tessel/core/random.h"
#include "tessel/core/tensor.h"
#include "tessel/kernels/reference.h"
#include "tessel/sparse/estimators/xattention_estimator.h"

namespace tessel::kv::testing {

// Rows [first, first + count) of a contiguous (1, S, H, D) tensor.
inline TensorView rows(const TensorView& t, int64_t first, int64_t count) {
  const int64_t row_elements = t.size(2) * t.size(3);
  return TensorView(static_cast<char*>(t.data()) + first * row_elements * static_cast<int64_t>(dtype_size(t.dtype())),
                    t.dtype(), t.device(), {1, count, t.size(2), t.size(3)});
}

// XAttention-BSA options: threshold τ, stride and vote threshold.
inline XAttentionOptions xattention_options(double threshold, int64_t stride, double vote_threshold) {
  XAttentionOptions o;
  o.threshold = threshold;
  o.stride = stride;
  o.vote_threshold = vote_threshold;
  return o;
}

inline Tensor random_bshd(int64_t seq, int64_t heads, int64_t dim, uint64_t seed, double stddev = 1.0) {
  Tensor t = Tensor::empty({1, seq, heads, dim}, DType::kF32);
  fill_normal(t.view(), seed, 0.0, stddev);
  return t;
}

// Largest |out - reference| over the reference's rows (out holds all S rows of q).
inline double max_error(const TensorView& out, const reference::AttentionResult& ref) {
  double worst = 0;
  for (int64_t r = 0; r < ref.rows(); ++r)
    for (int64_t h = 0; h < ref.heads; ++h)
      for (int64_t d = 0; d < ref.head_dim; ++d) {
        const int64_t index = (ref.q_rows[static_cast<size_t>(r)] * ref.heads + h) * ref.head_dim + d;
        const double got = element_as_double(out, index);
        if (!std::isfinite(got)) return INFINITY;
        worst = std::max(worst, std::abs(got - ref.out_at(0, r, h, d)));
      }
  return worst;
}

// How much of the shorter of (compute, copy) was hidden under the other, given the pipeline's total
// time: 0 for a serialized pipeline (total = compute + copy), 1 for perfect overlap.
inline double overlap_fraction(double total, double compute, double copy) {
  return (compute + copy - total) / std::min(compute, copy);
}

}  // namespace tessel::kv::testing
