// The longest-first schedule of the sparse Hopper kernel: a counting sort of the work items by the
// number of 64-key tiles their mask row keeps, in one CTA. It runs on the device (in stream order,
// before the attention kernel) because masks estimated inside a forward exist only there.
#include "cuda/hopper/work_order.h"

#include <algorithm>

#include "cuda/flash_forward_kernel.cuh"
#include "cuda/mask_rows.cuh"

namespace tessel::cuda::detail {

namespace {

constexpr int kOrderThreads = 1024;
// Tile counts at or above kCostBins - 1 share the first bin; rows that long are ordered among
// themselves arbitrarily, which costs nothing: they all start in the first wave.
constexpr int kCostBins = 2048;
constexpr int kBinsPerThread = kCostBins / kOrderThreads;
static_assert(kCostBins % kOrderThreads == 0);
// Items whose mask rows a thread reads before it touches the bins (the loads overlap).
constexpr int kItemsInFlight = 4;

// Bin of an item: kept tiles descending, so ascending bins are the longest-first order.
__device__ __forceinline__ int cost_bin(const FlashParams& p, int item, int q_blocks) {
  const WorkItem w = work_item_at(item, q_blocks, p.heads_q);
  const TileWalk<true> walk = make_tile_walk<true>(p, w.batch, w.head, w.m0, min(w.m0 + hopper::kBlockM, p.seq_q) - 1);
  const int tiles = walk.row_blocks << walk.sub_shift;
  return kCostBins - 1 - min(tiles, kCostBins - 1);
}

// Calls visit(item, bin) for this thread's items, kItemsInFlight mask rows read before any visit.
template <typename Visit>
__device__ __forceinline__ void for_each_item_bin(const FlashParams& p, int items, int q_blocks, Visit visit) {
  for (int first = threadIdx.x; first < items; first += kOrderThreads * kItemsInFlight) {
    int bin[kItemsInFlight];
#pragma unroll
    for (int u = 0; u < kItemsInFlight; ++u) {
      const int item = first + u * kOrderThreads;
      bin[u] = item < items ? cost_bin(p, item, q_blocks) : -1;
    }
#pragma unroll
    for (int u = 0; u < kItemsInFlight; ++u)
      if (bin[u] >= 0) visit(first + u * kOrderThreads, bin[u]);
  }
}

__global__ void __launch_bounds__(kOrderThreads) longest_first_order_kernel(const FlashParams p, int items, int q_blocks,
                                                                            int32_t* order, int32_t* next_rank) {
  __shared__ int bins[kCostBins];
  const int tid = threadIdx.x;
  for (int b = tid; b < kCostBins; b += kOrderThreads) bins[b] = 0;
  if (tid == 0) *next_rank = 0;
  __syncthreads();
  for_each_item_bin(p, items, q_blocks, [&](int, int bin) { atomicAdd(&bins[bin], 1); });
  __syncthreads();
  // Bin counts -> first rank of each bin (each thread owns kBinsPerThread adjacent bins).
  int own = 0;
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) own += bins[tid * kBinsPerThread + j];
  int total = 0;
  int rank = block_exclusive_scan(own, &total);
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {
    const int count = bins[tid * kBinsPerThread + j];
    bins[tid * kBinsPerThread + j] = rank;
    rank += count;
  }
  __syncthreads();
  for_each_item_bin(p, items, q_blocks, [&](int item, int bin) { order[atomicAdd(&bins[bin], 1)] = item; });
}

}  // namespace

size_t work_order_bytes(int64_t batch, int64_t seq_q, int64_t heads_q) {
  const int64_t items = (seq_q + hopper::kBlockM - 1) / hopper::kBlockM * std::max<int64_t>(heads_q, 0) *
                        std::max<int64_t>(batch, 0);
  return workspace_slice_bytes(static_cast<size_t>(std::max<int64_t>(items, 0)) * sizeof(int32_t)) +
         workspace_slice_bytes(sizeof(int32_t));
}

WorkOrder take_work_order(const ExecContext& ctx, Device device, int batch, int seq_q, int heads_q) {
  if (ctx.workspace == nullptr || ctx.workspace->device() != device ||
      ctx.workspace->capacity() < work_order_bytes(batch, seq_q, heads_q))
    return {};
  WorkspaceSlicer slicer(*ctx.workspace);
  WorkOrder order;
  order.order = slicer.take<int32_t>(static_cast<size_t>(work_item_count(seq_q, heads_q, batch)), "work order");
  order.next_rank = slicer.take<int32_t>(1, "work order counter");
  return order;
}

void launch_longest_first_order(const FlashParams& params, int batch, const WorkOrder& order, cudaStream_t stream) {
  const int q_blocks = (params.seq_q + hopper::kBlockM - 1) / hopper::kBlockM;
  const int items = static_cast<int>(work_item_count(params.seq_q, params.heads_q, batch));
  longest_first_order_kernel<<<1, kOrderThreads, 0, stream>>>(params, items, q_blocks, order.order, order.next_rank);
}

}  // namespace tessel::cuda::detail
