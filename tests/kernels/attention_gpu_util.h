// Helpers for the GPU attention tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tessel/kernels/block_mask_view.h"
#include "tessel/kernels/reference.h"

namespace tessel::gpu_test {

// True when the CPU mask keeps the kv block of key j for query i of (batch, q head h).
inline bool mask_keeps(const BlockMaskView& mask, int64_t heads, int64_t kv_heads, int64_t b, int64_t h, int64_t i,
                       int64_t j) {
  const int64_t row = mask.row(b, mask.mask_head_for(h, heads, kv_heads), i / mask.block_q);
  const int32_t* begin = mask.indices + mask.indptr[row];
  const int32_t* end = mask.indices + mask.indptr[row + 1];
  return std::binary_search(begin, end, static_cast<int32_t>(j / mask.block_kv));
}

// Max |a.out - b.out| over two results of the same rows (the plain-dtype baseline's error).
inline double max_out_difference(const reference::AttentionResult& a, const reference::AttentionResult& b) {
  double e = 0.0;
  for (size_t i = 0; i < a.out.size(); ++i) e = std::max(e, std::abs(a.out[i] - b.out[i]));
  return e;
}

}  // namespace tessel::gpu_test
