// The cache backends behind make_cache_backend, one file each, and what they share.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tessel/diffusion/cache_backend.h"

namespace tessel {

std::unique_ptr<CacheBackend> make_teacache(const CacheConfig& config, const WanConfig& transformer);
std::unique_ptr<CacheBackend> make_dbcache(const CacheConfig& config, const WanConfig& transformer);

// The CFG branch of batch row `row`: the row itself when the pipeline batches the branches, the
// step's branch when this process runs one (CFG-parallel).
inline size_t cache_branch(const WanBlockCacheInput& input, int64_t row) {
  if (input.batch == 1 && input.step != nullptr) return input.step->cfg_branch == 1 ? 1 : 0;
  return static_cast<size_t>(row);
}

// The residual a skipped span stands in for: out - in of batch row `row` ((batch, size) buffers).
inline void keep_span_residual(std::vector<float>& residual, const float* out, const float* in, int64_t row, size_t size) {
  const size_t offset = static_cast<size_t>(row) * size;
  residual.assign(out + offset, out + offset + size);
  for (size_t i = 0; i < size; ++i) residual[i] -= in[offset + i];
}

// Stands in for the span in batch row `row` of `hidden`: adds the residual it kept.
inline void add_span_residual(float* hidden, int64_t row, const std::vector<float>& residual) {
  float* destination = hidden + static_cast<size_t>(row) * residual.size();
  for (size_t i = 0; i < residual.size(); ++i) destination[i] += residual[i];
}

}  // namespace tessel
