// Internal: the longest-first schedule of the sparse Hopper forward kernel (work_items.h): its
// workspace size, and the kernel that sorts a block mask's work items by kept-block count.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/flash_params.h"
#include "cuda/hopper/work_items.h"
#include "tessel/core/exec_context.h"

namespace tessel::cuda::detail {

// Workspace bytes of the schedule for these sizes (the order list and the claim counter).
size_t work_order_bytes(int64_t batch, int64_t seq_q, int64_t heads_q);

// The schedule's slices of ctx.workspace when it is a workspace on `device` with room for them;
// an empty WorkOrder (static order) otherwise.
WorkOrder take_work_order(const ExecContext& ctx, Device device, int batch, int seq_q, int heads_q);

// Fills order.order with the items of the block mask in `params` sorted by their kept 64-key tiles,
// most first, and resets order.next_rank, on `stream` (one CTA; no host synchronization).
void launch_longest_first_order(const FlashParams& params, int batch, const WorkOrder& order, cudaStream_t stream);

}  // namespace tessel::cuda::detail
