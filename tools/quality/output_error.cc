#include "quality/output_error.h"

#include <cmath>

#include "tessel/core/error.h"

namespace tessel {

OutputError compare_outputs(const TensorView& approx, const TensorView& reference) {
  check_device(approx, Device::cpu(), "approx");
  check_device(reference, Device::cpu(), "reference");
  check_shape(approx, reference.shape(), "approx");
  const Tensor a = Tensor::empty(approx.shape(), DType::kF32), r = Tensor::empty(reference.shape(), DType::kF32);
  copy_convert(approx, a.view());
  copy_convert(reference, r.view());
  const float* ad = a.data_as<float>();
  const float* rd = r.data_as<float>();
  double diff = 0.0, ref = 0.0, app = 0.0, cross = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = ad[i], y = rd[i];
    diff += (x - y) * (x - y);
    ref += y * y;
    app += x * x;
    cross += x * y;
  }
  OutputError e;
  e.rel_l2 = ref > 0.0 ? std::sqrt(diff / ref) : std::sqrt(diff);
  e.cosine = (app > 0.0 && ref > 0.0) ? cross / std::sqrt(app * ref) : (app == 0.0 && ref == 0.0 ? 1.0 : 0.0);
  return e;
}

}  // namespace tessel
