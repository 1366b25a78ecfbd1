// A histogram of observations over fixed bucket bounds, as /metrics reports it (Prometheus'
// histogram: cumulative bucket counts, the sum and the count): the engine's batch sizes per step
// and queue times per request.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace tessel::engine {

struct Histogram {
  Histogram() = default;
  explicit Histogram(std::vector<double> upper_bounds) : bounds(std::move(upper_bounds)), counts(bounds.size(), 0) {}

  void add(double value) {
    const size_t bucket = static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin());
    if (bucket < counts.size()) ++counts[bucket];
    sum += value;
    ++count;
  }
  // Observations <= bounds[i] (Prometheus' `le` bucket); the last bucket, +Inf, is `count`.
  int64_t cumulative(size_t i) const {
    int64_t total = 0;
    for (size_t j = 0; j <= i && j < counts.size(); ++j) total += counts[j];
    return total;
  }

  std::vector<double> bounds;   // ascending upper bounds
  std::vector<int64_t> counts;  // per bound: observations in (bounds[i - 1], bounds[i]]
  double sum = 0.0;
  int64_t count = 0;
};

}  // namespace tessel::engine
