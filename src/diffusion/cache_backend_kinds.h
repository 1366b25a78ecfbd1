// The cache backends behind make_cache_backend, one file each, and what they share.
#pragma once

#include <cstdint>
#include <memory>

#include "tessel/diffusion/cache_backend.h"

namespace tessel {

std::unique_ptr<CacheBackend> make_teacache(const CacheConfig& config, const WanConfig& transformer, int64_t height, int64_t width);
std::unique_ptr<CacheBackend> make_dbcache(const CacheConfig& config, const WanConfig& transformer);

// The CFG branch of batch row `row`: the row itself when the pipeline batches the branches, the
// step's branch when this process runs one (CFG-parallel).
inline size_t cache_branch(const WanBlockCacheInput& input, int64_t row) {
  if (input.batch == 1 && input.step != nullptr) return input.step->cfg_branch == 1 ? 1 : 0;
  return static_cast<size_t>(row);
}

}  // namespace tessel
