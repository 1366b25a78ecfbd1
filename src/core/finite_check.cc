#include "tessel/core/finite_check.h"

#include <cmath>

#include "tessel/core/error.h"

namespace tessel {
namespace {

std::string multi_index(const Shape& shape, int64_t index) {
  Shape position(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    position[d] = shape[d] > 0 ? index % shape[d] : 0;
    index = shape[d] > 0 ? index / shape[d] : 0;
  }
  return shape_str(position);
}

// Contiguous 16- and 32-bit data: counted from the exponent bits (all ones: NaN or infinity),
// over the cores, with no widened copy, so that checking checkpoints at load stays cheap.
template <typename Bits>
int64_t count_all_ones_exponent(const Bits* data, int64_t n, Bits exponent_mask) {
  int64_t count = 0;
#pragma omp parallel for reduction(+ : count) schedule(static)
  for (int64_t i = 0; i < n; ++i) count += (data[i] & exponent_mask) == exponent_mask;
  return count;
}

}  // namespace

NonFiniteSummary find_non_finite(const TensorView& view) {
  check_device(view, Device::cpu(), "find_non_finite view");
  NonFiniteSummary summary;
  if (!is_floating(view.dtype())) return summary;
  const int64_t n = view.numel();
  if (view.is_contiguous() && n > 0) {  // the common case is clean: count fast, locate only when needed
    int64_t count = -1;
    switch (view.dtype()) {
      case DType::kBF16: count = count_all_ones_exponent(view.data_as<const uint16_t>(), n, uint16_t{0x7F80}); break;
      case DType::kF16: count = count_all_ones_exponent(view.data_as<const uint16_t>(), n, uint16_t{0x7C00}); break;
      case DType::kF32: count = count_all_ones_exponent(view.data_as<const uint32_t>(), n, uint32_t{0x7F800000}); break;
      default: break;
    }
    if (count == 0) return summary;
  }
  const auto note = [&](int64_t i, double value) {
    if (summary.count++ == 0) {
      summary.first_index = i;
      summary.first_value = value;
    }
  };
  if (view.dtype() != DType::kF64) {
    // fp16 and bf16 widen to fp32 exactly (infinities and NaN stay what they are).
    Tensor widened;
    const float* data = view.data_as<const float>();
    if (view.dtype() != DType::kF32 || !view.is_contiguous()) {
      widened = Tensor::empty(view.shape(), DType::kF32);
      copy_convert(view, widened.view());
      data = widened.data_as<const float>();
    }
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(data[i])) note(i, data[i]);
    return summary;
  }
  for (int64_t i = 0; i < n; ++i) {
    const double value = element_as_double(view, i);
    if (!std::isfinite(value)) note(i, value);
  }
  return summary;
}

void check_finite(const TensorView& view, const std::string& argument, const std::string& hint) {
  const NonFiniteSummary s = find_non_finite(view);
  if (s.count == 0) return;
  throw Error(detail::concat(argument, ": expected finite values, got ", s.count, " non-finite of ", view.numel(), " (first: ",
                             s.first_value, " at element ", multi_index(view.shape(), s.first_index), ")",
                             hint.empty() ? "" : "; ", hint));
}

}  // namespace tessel
