#include "tessel/core/random.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/core/parallel.h"

namespace tessel {
namespace {

constexpr uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ull;

// Fills dst with value(rng) per element in order, `draws` generator outputs per element. A chunk
// starting at element i starts from state seed + i * draws * gamma — exactly where the serial walk
// would be (splitmix64 advances its state by gamma per draw) — so the chunks run in parallel and
// the values equal the serial fill's: a 75,600 x 40 x 128 q fills in seconds instead of a minute.
template <typename Value>
void fill_with(const TensorView& dst, uint64_t seed, uint64_t draws, Value&& value) {
  check_device(dst, Device::cpu(), "dst");
  if (!is_floating(dst.dtype())) fail_argument("dst", "a floating dtype", dtype_name(dst.dtype()));
  if (dst.is_contiguous()) {
    // Through a small fp64 buffer per chunk: the values and their rounding of one whole fp64
    // tensor, without its memory (eight bytes per element) or the strided copy.
    constexpr int64_t kChunk = int64_t{1} << 16;
    const int64_t n = dst.numel();
    const int64_t element_bytes = static_cast<int64_t>(dtype_size(dst.dtype()));
    parallel_for((n + kChunk - 1) / kChunk, [&](int64_t chunk) {
      const int64_t start = chunk * kChunk, len = std::min(kChunk, n - start);
      SplitMix64 rng{seed + static_cast<uint64_t>(start) * draws * kSplitMixGamma};
      std::vector<double> values(static_cast<size_t>(len));
      for (double& v : values) v = value(rng);
      copy_convert(TensorView(values.data(), DType::kF64, Device::cpu(), Shape{len}),
                   TensorView(static_cast<char*>(dst.data()) + start * element_bytes, dst.dtype(), Device::cpu(), Shape{len}));
    });
    return;
  }
  SplitMix64 rng{seed};
  Tensor values = Tensor::empty(dst.shape(), DType::kF64);
  double* v = values.data_as<double>();
  for (int64_t i = 0; i < values.numel(); ++i) v[i] = value(rng);
  copy_convert(values.view(), dst);
}

}  // namespace

void fill_uniform(const TensorView& dst, uint64_t seed, double low, double high) {
  fill_with(dst, seed, 1, [&](SplitMix64& rng) { return low + (high - low) * rng.uniform01(); });
}

void fill_normal(const TensorView& dst, uint64_t seed, double mean, double stddev) {
  fill_with(dst, seed, 2, [&](SplitMix64& rng) {
    // Box–Muller; 1 - u keeps the log argument in (0, 1].
    const double u1 = 1.0 - rng.uniform01(), u2 = rng.uniform01();
    return mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  });
}

}  // namespace tessel
