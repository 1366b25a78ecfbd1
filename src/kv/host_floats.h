// Internal: reading small device or host tensors into fp32 host memory for host-side scoring.
#pragma once

#include <vector>

#include "tessel/core/tensor.h"

namespace tessel::kv {

// Copies a contiguous view (CPU or CUDA, any float dtype) into a row-major fp32 vector. A CUDA view
// is read with a synchronous copy ordered after the legacy default stream's work.
std::vector<float> to_host_floats(const TensorView& view);

}  // namespace tessel::kv
