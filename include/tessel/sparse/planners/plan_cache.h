// Static plans depend only on pattern and shape, so they are built once and shared: every layer
// and every denoising step with the same sequence shape reuses one plan. Thread-safe.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tessel/sparse/planners/static_patterns.h"

namespace tessel {

class StaticPlanCache {
 public:
  // Returns the cached plan for (patterns, request), planning it on first use.
  std::shared_ptr<const StaticPlan> get(const std::vector<StaticPattern>& per_head, const StaticPlanRequest& request);
  std::shared_ptr<const StaticPlan> get(const StaticPattern& pattern, const StaticPlanRequest& request) {
    return get(std::vector<StaticPattern>{pattern}, request);
  }
  size_t size() const;
  int64_t misses() const;  // how many plans were built
  void clear();

  // The key text: patterns, layout, block sizes and always-keep options.
  static std::string key(const std::vector<StaticPattern>& per_head, const StaticPlanRequest& request);

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const StaticPlan>> plans_;
  int64_t misses_ = 0;
};

}  // namespace tessel
