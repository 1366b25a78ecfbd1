#include "host_arrays.h"

#include <cstring>

#include "tensor_arg.h"
#include "tessel/core/error.h"

namespace nb = nanobind;

namespace tessel::python {

template <typename T>
std::vector<T> host_vector(const nb::ndarray<nb::ro>& array, const std::string& argument, int64_t rank) {
  const TensorView view = tensor_view(array, argument);
  check_device(view, Device::cpu(), argument);
  check_dtype(view, DTypeOf<T>::value, argument);
  if (rank >= 0) check_rank(view, rank, argument);
  check_contiguous(view, argument);
  std::vector<T> values(static_cast<size_t>(view.numel()));
  if (!values.empty()) std::memcpy(values.data(), view.data(), values.size() * sizeof(T));
  return values;
}

template <typename T>
nb::object numpy_array(std::vector<T> values, const Shape& shape) {
  auto* owned = new std::vector<T>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  std::vector<size_t> extents(shape.begin(), shape.end());
  return nb::cast(nb::ndarray<nb::numpy, T>(owned->data(), extents.size(), extents.data(), owner));
}

template std::vector<int32_t> host_vector<int32_t>(const nb::ndarray<nb::ro>&, const std::string&, int64_t);
template std::vector<uint8_t> host_vector<uint8_t>(const nb::ndarray<nb::ro>&, const std::string&, int64_t);
template nb::object numpy_array<int32_t>(std::vector<int32_t>, const Shape&);
template nb::object numpy_array<uint8_t>(std::vector<uint8_t>, const Shape&);
template nb::object numpy_array<float>(std::vector<float>, const Shape&);

}  // namespace tessel::python
