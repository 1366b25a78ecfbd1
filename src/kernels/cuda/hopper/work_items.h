// The work items of the persistent Hopper forward kernel and the order they are handed out in.
//
// A work item is 128 query rows of one (batch, head). Item ids enumerate them with the query
// blocks fastest and in descending order (causal: the longest rows first), so CTAs that run
// together read the K/V of few heads (L2). The kernel either walks ids with a static stride (CTA
// c takes c, c + grid, ...) or, given a WorkOrder, claims ranks from a device counter and runs
// order[rank]: a list sorted by kept-block count, longest first, so the rows of a block mask that
// keep many blocks start early and the short ones fill the gaps at the end.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tessel::cuda::detail {

namespace hopper {
inline constexpr int kBlockM = 128;  // query rows per work item (64 per consumer warpgroup)
}  // namespace hopper

struct WorkItem {
  int m0, head, batch;
};

__host__ __device__ __forceinline__ int64_t work_item_count(int seq_q, int heads_q, int batch) {
  return static_cast<int64_t>((seq_q + hopper::kBlockM - 1) / hopper::kBlockM) * heads_q * batch;
}

__device__ __forceinline__ WorkItem work_item_at(int item, int q_blocks, int heads_q) {
  return WorkItem{(q_blocks - 1 - item % q_blocks) * hopper::kBlockM, (item / q_blocks) % heads_q,
                  item / (q_blocks * heads_q)};
}

// Device memory of a longest-first schedule: `order` holds every item id once, `next_rank` the
// count of ranks claimed so far (reset to 0 by the kernel that fills `order`). Both null: the
// static order.
struct WorkOrder {
  int32_t* order = nullptr;
  int32_t* next_rank = nullptr;
  __host__ __device__ bool enabled() const { return order != nullptr; }
};

}  // namespace tessel::cuda::detail
