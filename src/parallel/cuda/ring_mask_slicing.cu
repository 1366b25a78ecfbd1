// The two passes of slice_ring_mask (see ring_mask_slicing.h). A row's kv-block ids are sorted, so
// the ids of one key shard are a contiguous run of the row, found by two binary searches.
#include "ring_mask_slicing.h"

#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include "tessel/core/error.h"

namespace tessel::parallel_detail::cuda {
namespace {

constexpr int kScanThreads = 1024;

// The first position in [first, last) whose id is >= value.
__device__ int32_t lower_bound(const int32_t* ids, int32_t first, int32_t last, int64_t value) {
  while (first < last) {
    const int32_t middle = first + (last - first) / 2;
    if (ids[middle] < value) first = middle + 1; else last = middle;
  }
  return first;
}

struct ShardColumns {
  int64_t lo, hi;
};

__device__ ShardColumns shard_columns(const RingMaskSlices& s, int step) {
  const int source = (s.rank - step + s.ring) % s.ring;
  const int64_t lo = min(source * s.chunk_blocks, s.kv_blocks);  // a shard past the end holds nothing
  return {lo, min(lo + s.chunk_blocks, s.kv_blocks)};
}

// Block `step` writes that step's indptr: an inclusive scan of the rows' counts, a tile of 1024 rows
// at a time.
__global__ void count_and_scan(RingMaskSlices s) {
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage scratch;
  const int step = blockIdx.x;
  const ShardColumns columns = shard_columns(s, step);
  int32_t* indptr = s.out_indptr + step * (s.rows + 1);
  if (threadIdx.x == 0) indptr[0] = 0;
  int32_t carried = 0;
  for (int64_t tile = 0; tile < s.rows; tile += kScanThreads) {
    const int64_t row = tile + threadIdx.x;
    int32_t count = 0;
    if (row < s.rows) {
      const int32_t first = s.indptr[row], last = s.indptr[row + 1];
      count = lower_bound(s.indices, first, last, columns.hi) - lower_bound(s.indices, first, last, columns.lo);
    }
    int32_t inclusive = 0, total = 0;
    Scan(scratch).InclusiveSum(count, inclusive, total);
    if (row < s.rows) indptr[row + 1] = carried + inclusive;
    carried += total;
    __syncthreads();  // the scan's shared storage is reused by the next tile
  }
}

// Block `row` copies the row's run of every step, renumbered from the shard's first block.
__global__ void scatter(RingMaskSlices s) {
  const int64_t row = blockIdx.x;
  const int32_t first = s.indptr[row], last = s.indptr[row + 1];
  for (int step = 0; step < s.ring; ++step) {
    const ShardColumns columns = shard_columns(s, step);
    const int32_t begin = lower_bound(s.indices, first, last, columns.lo);
    const int32_t end = lower_bound(s.indices, begin, last, columns.hi);
    int32_t* out = s.out_indices + step * s.capacity + s.out_indptr[step * (s.rows + 1) + row];
    for (int32_t i = begin + static_cast<int32_t>(threadIdx.x); i < end; i += blockDim.x)
      out[i - begin] = s.indices[i] - static_cast<int32_t>(columns.lo);
  }
}

}  // namespace

void slice_ring_mask(void* stream, const RingMaskSlices& slices) {
  if (slices.ring < 1 || slices.rank < 0 || slices.rank >= slices.ring || slices.chunk_blocks < 1 ||
      slices.capacity < slices.rows * slices.chunk_blocks)
    fail_argument("ring mask slices", "1 <= ring, 0 <= rank < ring, chunk_blocks >= 1, capacity >= rows x chunk_blocks",
                  detail::concat("ring ", slices.ring, " rank ", slices.rank, " chunk_blocks ", slices.chunk_blocks,
                                 " capacity ", slices.capacity, " for ", slices.rows, " rows"));
  const auto s = static_cast<cudaStream_t>(stream);
  count_and_scan<<<slices.ring, kScanThreads, 0, s>>>(slices);
  if (slices.rows > 0) scatter<<<static_cast<unsigned>(slices.rows), 64, 0, s>>>(slices);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw Error(detail::concat("slice_ring_mask: ", cudaGetErrorString(status)));
}

}  // namespace tessel::parallel_detail::cuda
