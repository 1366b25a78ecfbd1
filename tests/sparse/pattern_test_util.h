// Helpers for the pattern, estimator and quality tests.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/sparse/block_mask.h"

namespace tessel::testing {

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
