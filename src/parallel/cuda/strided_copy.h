// One-launch copies and fills between strided views on a CUDA stream: the layout changes of the
// sequence-parallel strategies (Ulysses pack/unpack, Ring K/V staging, padding rows). A view of any
// rank up to kMaxStridedRank whose innermost dimension is contiguous is one kernel, whatever its
// number of rows: a per-row cudaMemcpy2DAsync costs ~5 us of host time each, which at 75,600 tokens
// was the whole step (docs/parallel.md).
#pragma once

#include <cstdint>

namespace tessel::parallel_detail::cuda {

inline constexpr int kMaxStridedRank = 6;

// Sizes and strides in elements; dimension rank-1 is contiguous in both views (stride 1).
struct StridedLayout {
  int rank = 0;
  int64_t sizes[kMaxStridedRank] = {};
  int64_t src_strides[kMaxStridedRank] = {};
  int64_t dst_strides[kMaxStridedRank] = {};
};

// dst[i] = src[i] for every index of `layout` (element_bytes 1, 2, 4, 8 or 16); `stream` is a
// cudaStream_t. Enqueues one kernel (none when empty); throws Error when the launch fails.
void copy_strided(void* stream, const void* src, void* dst, const StridedLayout& layout, int element_bytes);
// dst[i] = 0 (dst_strides of `layout` used; src_strides ignored).
void zero_strided(void* stream, void* dst, const StridedLayout& layout, int element_bytes);

}  // namespace tessel::parallel_detail::cuda
