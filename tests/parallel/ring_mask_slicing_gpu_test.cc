// The device cut of a rank's row mask into its Ring steps' masks (cuda/ring_mask_slicing.h) against
// the host's slice_block_mask of the same rows: random masks of many shapes (partial last blocks, a
// last shard shorter than the others, empty rows, rows keeping every block, one to five ranks),
// every rank's view, the output buffers poisoned first. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "block_mask_slicing.h"
#include "tessel/core/device.h"
#include "tessel/sparse/block_mask.h"
#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/ring_mask_slicing.h"
#endif

namespace tessel {
namespace {

#ifdef TESSEL_WITH_CUDA

struct MaskCase {
  int64_t batch, heads, seq_q, seq_kv, block_q, block_kv, chunk_blocks;
  int ring;
  double density;
};

std::vector<int32_t> from_device(const int32_t* data, int64_t count) {
  std::vector<int32_t> host(static_cast<size_t>(count));
  if (count > 0) EXPECT_EQ(cudaMemcpy(host.data(), data, count * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

int32_t* to_device(const std::vector<int32_t>& host) {
  int32_t* data = nullptr;
  EXPECT_EQ(cudaMalloc(&data, std::max<size_t>(host.size(), 1) * sizeof(int32_t)), cudaSuccess);
  if (!host.empty()) EXPECT_EQ(cudaMemcpy(data, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice), cudaSuccess);
  return data;
}

TEST(RingMaskSlicingGpu, EachStepEqualsTheHostSliceOfItsKeyShard) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped";
  const std::vector<MaskCase> cases = {
      {1, 1, 128, 256, 128, 64, 1, 4, 0.5},     // one block per shard
      {2, 3, 300, 1000, 128, 64, 4, 4, 0.3},    // partial blocks, the last shard shorter
      {2, 40, 1024, 4096, 128, 64, 16, 4, 0.2}, // many rows
      {1, 2, 77, 77 * 5, 16, 16, 5, 5, 1.0},    // every block kept
      {1, 2, 64, 200, 32, 32, 2, 4, 0.05},      // rows of one block
      {3, 1, 500, 900, 64, 32, 29, 1, 0.4},     // a ring of one
      {1, 1, 64, 100, 32, 32, 2, 4, 0.5},       // shards past the end (fewer keys than ranks' chunks)
  };
  uint64_t seed = 7;
  for (const MaskCase& c : cases) {
    const BlockMaskShape shape{c.batch, c.heads, c.seq_q, c.seq_kv, c.block_q, c.block_kv};
    std::vector<uint8_t> dense = BlockMask::random(shape, c.density, ++seed).to_dense();
    std::fill(dense.begin(), dense.begin() + shape.kv_blocks(), 0);  // an empty row
    const BlockMask rows = BlockMask::from_dense(shape, dense);
    for (int rank = 0; rank < c.ring; ++rank) {
      SCOPED_TRACE(testing::Message() << "rows " << rows.shape().num_rows() << " kv blocks " << shape.kv_blocks()
                                      << " ring " << c.ring << " rank " << rank);
      const int64_t row_count = shape.num_rows(), capacity = row_count * c.chunk_blocks;
      int32_t* indptr = to_device(rows.indptr());
      int32_t* indices = to_device(rows.indices());
      // Poisoned: every indptr entry and every index a step owns must be written.
      int32_t* out = to_device(std::vector<int32_t>(static_cast<size_t>(c.ring * (row_count + 1 + capacity)), -77));
      parallel_detail::cuda::RingMaskSlices s;
      s.indptr = indptr;
      s.indices = indices;
      s.rows = row_count;
      s.kv_blocks = shape.kv_blocks();
      s.chunk_blocks = c.chunk_blocks;
      s.ring = c.ring;
      s.rank = rank;
      s.out_indptr = out;
      s.out_indices = out + c.ring * (row_count + 1);
      s.capacity = capacity;
      parallel_detail::cuda::slice_ring_mask(nullptr, s);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      for (int step = 0; step < c.ring; ++step) {
        const int source = (rank - step + c.ring) % c.ring;
        const int64_t first_key = source * c.chunk_blocks * c.block_kv;
        const int64_t keys = std::clamp<int64_t>(c.seq_kv - first_key, 0, c.chunk_blocks * c.block_kv);
        const std::vector<int32_t> got_indptr = from_device(s.out_indptr + step * (row_count + 1), row_count + 1);
        if (keys == 0) {  // a shard past the end: no blocks in any row
          for (int32_t offset : got_indptr) EXPECT_EQ(offset, 0);
          continue;
        }
        const BlockMask expected = parallel_detail::slice_block_mask(rows, {0, c.heads}, {0, c.seq_q}, {first_key, keys});
        EXPECT_EQ(got_indptr, expected.indptr()) << "step " << step;
        EXPECT_EQ(from_device(s.out_indices + step * capacity, expected.nnz()), expected.indices()) << "step " << step;
      }
      cudaFree(indptr);
      cudaFree(indices);
      cudaFree(out);
    }
  }
}

#else
TEST(RingMaskSlicingGpu, EachStepEqualsTheHostSliceOfItsKeyShard) {
  GTEST_SKIP() << "tessel built without CUDA: GPU test skipped";
}
#endif

}  // namespace
}  // namespace tessel
