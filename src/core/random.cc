#include "tessel/core/random.h"

#include <cmath>

#include "tessel/core/error.h"

namespace tessel {
namespace {

template <typename Gen>
void fill_with(const TensorView& dst, Gen&& gen) {
  check_device(dst, Device::cpu(), "dst");
  if (!is_floating(dst.dtype())) fail_argument("dst", "a floating dtype", dtype_name(dst.dtype()));
  Tensor values = Tensor::empty(dst.shape(), DType::kF64);
  double* v = values.data_as<double>();
  for (int64_t i = 0; i < values.numel(); ++i) v[i] = gen();
  copy_convert(values.view(), dst);
}

}  // namespace

void fill_uniform(const TensorView& dst, uint64_t seed, double low, double high) {
  SplitMix64 rng{seed};
  fill_with(dst, [&] { return low + (high - low) * rng.uniform01(); });
}

void fill_normal(const TensorView& dst, uint64_t seed, double mean, double stddev) {
  SplitMix64 rng{seed};
  fill_with(dst, [&] {
    // Box–Muller; 1 - u keeps the log argument in (0, 1].
    const double u1 = 1.0 - rng.uniform01(), u2 = rng.uniform01();
    return mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  });
}

}  // namespace tessel
