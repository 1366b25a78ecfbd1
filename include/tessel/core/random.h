// Seeded random fills (CPU views; deterministic for a given seed across platforms).
#pragma once

#include <cstdint>

#include "tessel/core/tensor.h"

namespace tessel {

void fill_uniform(const TensorView& dst, uint64_t seed, double low = -1.0, double high = 1.0);
void fill_normal(const TensorView& dst, uint64_t seed, double mean = 0.0, double stddev = 1.0);

}  // namespace tessel
