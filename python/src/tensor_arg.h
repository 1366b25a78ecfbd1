// DLPack arrays (numpy, torch through DLPack capsules, any producer nanobind accepts) as tessel
// TensorViews, zero-copy. Everything a kernel could trip over is rejected here or by the kernel's
// own checks with a tessel::Error naming the argument: unsupported dtype or device, vector lanes,
// negative strides.
#pragma once

#include <optional>
#include <string>

#include <nanobind/ndarray.h>

#include "tessel/core/tensor.h"

namespace tessel::python {

using AnyArray = nanobind::ndarray<>;
using ReadOnlyArray = nanobind::ndarray<nanobind::ro>;

// The view of `array` (named `argument` in errors). Booleans become uint8 (same storage).
TensorView tensor_view(const AnyArray& array, const std::string& argument);
TensorView tensor_view(const ReadOnlyArray& array, const std::string& argument);
// Empty view for None (an omitted optional output such as lse).
TensorView optional_tensor_view(const std::optional<AnyArray>& array, const std::string& argument);

}  // namespace tessel::python
