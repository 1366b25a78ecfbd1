#include "tessel/core/random.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tessel/core/error.h"

namespace tessel {
namespace {

template <typename Gen>
void fill_with(const TensorView& dst, Gen&& gen) {
  check_device(dst, Device::cpu(), "dst");
  if (!is_floating(dst.dtype())) fail_argument("dst", "a floating dtype", dtype_name(dst.dtype()));
  if (dst.is_contiguous()) {
    // Through a small fp64 buffer, chunk by chunk: the values and their rounding of one whole fp64
    // tensor, without its memory (eight bytes per element) or the strided copy.
    constexpr int64_t kChunk = int64_t{1} << 16;
    const int64_t n = dst.numel();
    std::vector<double> values(static_cast<size_t>(std::min(n, kChunk)));
    for (int64_t start = 0; start < n; start += kChunk) {
      const int64_t len = std::min(kChunk, n - start);
      for (int64_t i = 0; i < len; ++i) values[static_cast<size_t>(i)] = gen();
      copy_convert(TensorView(values.data(), DType::kF64, Device::cpu(), Shape{len}),
                   TensorView(static_cast<char*>(dst.data()) + start * static_cast<int64_t>(dtype_size(dst.dtype())), dst.dtype(),
                              Device::cpu(), Shape{len}));
    }
    return;
  }
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
