// Helpers for the pattern, estimator and quality tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/core/tensor.h"
#include "tessel/sparse/block_mask.h"

namespace tessel::testing {

// ‖approx − reference‖₂ / ‖reference‖₂ of two contiguous CPU fp32 tensors of one shape.
inline double relative_l2(const TensorView& approx, const TensorView& reference) {
  EXPECT_EQ(approx.shape(), reference.shape());
  const float* a = approx.data_as<float>();
  const float* r = reference.data_as<float>();
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < reference.numel(); ++i) {
    diff += (static_cast<double>(a[i]) - r[i]) * (static_cast<double>(a[i]) - r[i]);
    norm += static_cast<double>(r[i]) * r[i];
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

// Expects `f` to throw tessel::Error whose message contains every fragment.
template <typename F>
void expect_error_containing(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << fragments.front() << "'";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << message;
  }
}

// Kept kv blocks of every row of (batch 0, head `head`).
inline std::vector<std::vector<int32_t>> rows_of(const BlockMask& mask, int64_t head = 0) {
  std::vector<std::vector<int32_t>> rows;
  for (int64_t r = 0; r < mask.shape().q_blocks(); ++r) rows.push_back(mask.row(0, head, r));
  return rows;
}

}  // namespace tessel::testing
