// Seeded random fills (CPU views; deterministic for a given seed across platforms).
#pragma once

#include <cstdint>

#include "tessel/core/tensor.h"

namespace tessel {

// splitmix64: tiny, fast, identical on every platform (std distributions are not). The generator
// behind the fills below, and behind seeded choices elsewhere (e.g. random block masks).
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform01() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  uint64_t below(uint64_t n) { return next() % n; }  // n > 0; modulo bias is negligible for small n
};

void fill_uniform(const TensorView& dst, uint64_t seed, double low = -1.0, double high = 1.0);
void fill_normal(const TensorView& dst, uint64_t seed, double mean = 0.0, double stddev = 1.0);

}  // namespace tessel
