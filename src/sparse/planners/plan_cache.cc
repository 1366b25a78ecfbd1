#include "tessel/sparse/planners/plan_cache.h"

#include <sstream>

namespace tessel {

std::string StaticPlanCache::key(const std::vector<StaticPattern>& per_head, const StaticPlanRequest& request) {
  std::ostringstream os;
  for (const StaticPattern& p : per_head) os << describe_static_pattern(p) << ";";
  const TokenLayout& l = request.layout;
  os << "grid=" << l.grid.frames << "x" << l.grid.height << "x" << l.grid.width << ";text=" << l.text_tokens
     << (l.text_first ? "f" : "l") << ";blocks=" << request.block_q << "x" << request.block_kv
     << ";keep=" << request.keep.diagonal << "," << request.keep.sink_blocks << "," << request.keep.text;
  return os.str();
}

std::shared_ptr<const StaticPlan> StaticPlanCache::get(const std::vector<StaticPattern>& per_head, const StaticPlanRequest& request) {
  const std::string k = key(per_head, request);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = plans_.find(k);
    if (it != plans_.end()) return it->second;
  }
  // Plan outside the lock (it may take a while); a concurrent duplicate plan is harmless.
  auto plan = std::make_shared<const StaticPlan>(plan_static_pattern(per_head, request));
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, inserted] = plans_.emplace(k, plan);
  if (inserted) ++misses_;
  return it->second;
}

size_t StaticPlanCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return plans_.size();
}

int64_t StaticPlanCache::misses() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return misses_;
}

void StaticPlanCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  plans_.clear();
  misses_ = 0;
}

}  // namespace tessel
