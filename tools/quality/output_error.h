// How far an approximate attention output is from the dense one, over all elements (fp64 sums):
//   rel_l2 = ‖approx − reference‖₂ / ‖reference‖₂,  cosine = ⟨approx, reference⟩ / (‖approx‖₂ ‖reference‖₂).
#pragma once

#include "tessel/core/tensor.h"

namespace tessel {

struct OutputError {
  double rel_l2 = 0.0;
  double cosine = 1.0;
};

// CPU floating views of one shape. A zero reference gives rel_l2 = ‖approx‖ (and cosine 1 when
// both are zero, 0 otherwise). Throws Error on mismatched shapes or devices.
OutputError compare_outputs(const TensorView& approx, const TensorView& reference);

}  // namespace tessel
