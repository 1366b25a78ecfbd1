// Copies between host std::vectors and arrays handed to / returned to Python. Arrays coming in
// must be CPU, C-contiguous and of the element type asked for (the Python layer converts torch
// tensors and lists first); everything else is a tessel::Error naming the argument.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "tessel/core/dtype.h"
#include "tessel/core/tensor.h"

namespace tessel::python {

// The elements of `array` (read through a view, so any DLPack CPU producer works), checked to be
// CPU, contiguous, of `dtype` and of `rank` dimensions (rank < 0: any).
template <typename T>
std::vector<T> host_vector(const nanobind::ndarray<nanobind::ro>& array, const std::string& argument, int64_t rank);

// A numpy array that owns `values`, with `shape` (its product must equal values.size()).
template <typename T>
nanobind::object numpy_array(std::vector<T> values, const Shape& shape);

}  // namespace tessel::python
