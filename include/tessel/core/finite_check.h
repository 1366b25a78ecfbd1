// Finding NaN and infinities in data that came from outside (captured tensors, files) or that a
// computation produced (an attention output whose inputs overflowed), so a caller can refuse or
// flag it instead of reporting a plausible-looking number.
#pragma once

#include <cstdint>
#include <string>

#include "tessel/core/tensor.h"

namespace tessel {

struct NonFiniteSummary {
  int64_t count = 0;          // elements that are NaN or +-infinity
  int64_t first_index = -1;   // row-major logical index of the first one
  double first_value = 0.0;
};

// Scans a CPU view of any floating dtype (integer views have none).
NonFiniteSummary find_non_finite(const TensorView& view);

// Throws Error("<argument>: expected finite values, got N non-finite (first: nan at element i = [..]) <hint>")
// when the view holds any NaN or infinity.
void check_finite(const TensorView& view, const std::string& argument, const std::string& hint = "");

}  // namespace tessel
