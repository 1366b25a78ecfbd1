// One rank's row mask (its query rows against every key block, CSR as BlockMaskView: rows sorted
// and unique) cut on the device into one CSR per Ring step, so that a mask estimated on the device
// never goes through the host: step s attends to the key shard of ring position
// source = (rank - s) mod ring, kv blocks [source * chunk_blocks, min((source + 1) * chunk_blocks,
// kv_blocks)), renumbered from 0. The host equivalent is slice_block_mask (block_mask_slicing.h).
#pragma once

#include <cstdint>

namespace tessel::parallel_detail::cuda {

struct RingMaskSlices {
  const int32_t* indptr = nullptr;   // rows + 1
  const int32_t* indices = nullptr;  // indptr[rows]
  int64_t rows = 0, kv_blocks = 0, chunk_blocks = 0;
  int ring = 1, rank = 0;
  int32_t* out_indptr = nullptr;   // ring x (rows + 1): step s at s * (rows + 1)
  int32_t* out_indices = nullptr;  // ring x capacity: step s at s * capacity
  int64_t capacity = 0;            // >= rows * chunk_blocks
};

// Two kernels on `stream` (a cudaStream_t): per-step row counts and their prefix sums, then the
// scatter. No host synchronization; throws Error when a launch fails.
void slice_ring_mask(void* stream, const RingMaskSlices& slices);

}  // namespace tessel::parallel_detail::cuda
