// Parallel groups and sequence shards without communication: the rank order, the group members,
// the validation messages, shard arithmetic, the slicing of a global block mask, and the error of
// the MPI entry point in a build without MPI.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>

#include "block_mask_slicing.h"
#include "error_of.h"
#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "tessel/kernels/attention.h"
#include "tessel/parallel/communicator.h"
#include "tessel/parallel/parallel_attention.h"
#include "tessel/parallel/parallel_config.h"
#include "tessel/parallel/sequence_sharding.h"

namespace tessel {
namespace {

using testing::error_of;

TEST(ParallelConfig, RankOrderIsUlyssesThenRingThenCfgThenData) {
  ParallelConfig c;
  c.sp_ulysses_degree = 2;
  c.sp_ring_degree = 2;
  c.cfg_parallel_size = 2;
  c.data_parallel_size = 2;
  ASSERT_EQ(c.world_size(), 16);
  // rank 13 = 1 + 2 * (0 + 2 * (1 + 2 * 1)): ulysses 1, ring 0, cfg 1, data 1.
  const ParallelCoordinates p = parallel_coordinates(c, 13);
  EXPECT_EQ(p.ulysses, 1);
  EXPECT_EQ(p.ring, 0);
  EXPECT_EQ(p.cfg, 1);
  EXPECT_EQ(p.data, 1);
  EXPECT_EQ(p.sequence, 1);
  EXPECT_EQ(parallel_group_ranks(c, ParallelDim::kUlysses, 13), (std::vector<int>{12, 13}));
  EXPECT_EQ(parallel_group_ranks(c, ParallelDim::kRing, 13), (std::vector<int>{13, 15}));
  EXPECT_EQ(parallel_group_ranks(c, ParallelDim::kSequence, 13), (std::vector<int>{12, 13, 14, 15}));
  EXPECT_EQ(parallel_group_ranks(c, ParallelDim::kCfg, 13), (std::vector<int>{9, 13}));
  EXPECT_EQ(parallel_group_ranks(c, ParallelDim::kData, 13), (std::vector<int>{5, 13}));
  EXPECT_EQ(parallel_group_ranks(c, ParallelDim::kTensor, 13), (std::vector<int>{13}));
}

TEST(ParallelConfig, EveryRankIsInExactlyOneGroupPerDimension) {
  ParallelConfig c;
  c.sp_ulysses_degree = 3;
  c.sp_ring_degree = 2;
  c.cfg_parallel_size = 2;
  for (ParallelDim dim : {ParallelDim::kUlysses, ParallelDim::kRing, ParallelDim::kSequence, ParallelDim::kCfg}) {
    std::vector<int> seen(12, 0);
    for (int rank = 0; rank < 12; ++rank) {
      const auto group = parallel_group_ranks(c, dim, rank);
      if (group.front() == rank) for (int member : group) ++seen[static_cast<size_t>(member)];
      EXPECT_NE(std::find(group.begin(), group.end(), rank), group.end());
    }
    for (int count : seen) EXPECT_EQ(count, 1);
  }
}

TEST(ParallelConfig, BadDegreesGiveClearErrors) {
  ParallelConfig c;
  c.sp_ulysses_degree = 3;
  EXPECT_NE(error_of([&] { c.validate(4); }).find("sp_ulysses_degree: expected a divisor of the world size 4, got 3"),
            std::string::npos);
  c.sp_ulysses_degree = 2;
  EXPECT_NE(error_of([&] { c.validate(4); }).find("product"), std::string::npos);
  c.sp_ring_degree = 0;
  EXPECT_NE(error_of([&] { c.validate(4); }).find("sp_ring_degree: expected >= 1, got 0"), std::string::npos);
  c.sp_ring_degree = 1;
  c.tensor_parallel_size = 2;
  EXPECT_NE(error_of([&] { c.validate(4); }).find("tensor_parallel_size"), std::string::npos);
  c.tensor_parallel_size = 1;
  c.cfg_parallel_size = 4;
  c.sp_ulysses_degree = 1;
  EXPECT_NE(error_of([&] { c.validate(4); }).find("cfg_parallel_size: expected 1 or 2"), std::string::npos);
  c.cfg_parallel_size = 1;
  c.sp_ulysses_degree = 4;
  for (const int margin : {-1, 1025}) {
    c.ring_sm_margin = margin;
    EXPECT_NE(error_of([&] { c.validate(4); }).find("ParallelConfig.ring_sm_margin: expected in [0, 1024]"), std::string::npos);
  }
  c.ring_sm_margin = 0;
  EXPECT_NO_THROW(c.validate(4));
}

TEST(SequenceSharding, PadsTheLastShardAndAlignsToBlocks) {
  const SequenceSharding even = SequenceSharding::make(37, 4);
  EXPECT_EQ(even.shard_length, 10);
  EXPECT_EQ(even.valid(3), 7);
  const SequenceSharding aligned = SequenceSharding::make(37, 4, 8);
  EXPECT_EQ(aligned.shard_length, 16);
  EXPECT_EQ(aligned.valid(0), 16);
  EXPECT_EQ(aligned.valid(2), 5);
  EXPECT_EQ(aligned.valid(3), 0);
  EXPECT_NE(error_of([] { SequenceSharding::make(10, 0); }).find("parts: expected >= 1, got 0"), std::string::npos);
}

TEST(SequenceSharding, TakeShardZeroesThePadding) {
  const SequenceSharding s = SequenceSharding::make(5, 2);
  Tensor full = Tensor::empty({1, 5, 2}, DType::kF32);
  for (int i = 0; i < 10; ++i) full.data_as<float>()[i] = static_cast<float>(i + 1);
  Tensor shard = Tensor::empty({1, 3, 2}, DType::kF32);
  fill(shard, 99.0);
  take_shard(ExecContext{}, s, 1, full, shard);
  const float expected[] = {7, 8, 9, 10, 0, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(shard.data_as<float>()[i], expected[i]) << i;
}

TEST(BlockMaskSlicing, KeepsTheRowsAndShiftsTheKvBlocks) {
  // 2 heads, 20 tokens, 4x4 blocks (5 x 5 blocks; the last ones full).
  BlockMaskShape shape{1, 2, 20, 20, 4, 4};
  std::vector<std::vector<int32_t>> rows;
  for (int h = 0; h < 2; ++h)
    for (int qb = 0; qb < 5; ++qb) {  // the diagonal and one more block, different per head
      const std::set<int32_t> kept{qb, (qb + 2 + h) % 5};
      rows.emplace_back(kept.begin(), kept.end());
    }
  const BlockMask mask = BlockMask::from_rows(shape, rows);
  // Head 1, queries [8, 16) (q blocks 2, 3), keys [12, 20) (kv blocks 3, 4).
  const BlockMask piece = parallel_detail::slice_block_mask(mask, {1, 1}, {8, 8}, {12, 8});
  ASSERT_EQ(piece.shape().seq_q, 8);
  ASSERT_EQ(piece.shape().seq_kv, 8);
  const auto dense = piece.to_dense();  // (1, 1, 2, 2)
  const auto full = mask.to_dense();    // (1, 2, 5, 5)
  for (int qb = 0; qb < 2; ++qb)
    for (int kb = 0; kb < 2; ++kb)
      EXPECT_EQ(dense[static_cast<size_t>(qb * 2 + kb)], full[static_cast<size_t>(25 + (qb + 2) * 5 + kb + 3)]) << qb << kb;
  EXPECT_NE(error_of([&] { parallel_detail::slice_block_mask(mask, {0, 1}, {6, 4}, {0, 20}); })
                .find("queries: expected a range on block boundaries"),
            std::string::npos);
}

TEST(SingleRankCommunicator, OneRankGroupsRunTheLocalPathOfParallelAttention) {
  const ExecContext ctx;
  const auto world = make_single_rank_communicator(Device::cpu());
  const ParallelGroups groups = initialize_parallel_groups(*world, ParallelConfig{});
  const int64_t seq = 21, heads = 4, kv_heads = 2, dim = 8;
  Tensor q = Tensor::empty({1, seq, heads, dim}, DType::kF32), k = Tensor::empty({1, seq, kv_heads, dim}, DType::kF32),
         v = Tensor::empty({1, seq, kv_heads, dim}, DType::kF32);
  fill_normal(q, 1);
  fill_normal(k, 2);
  fill_uniform(v, 3);
  const BlockMask mask = BlockMask::random({1, heads, seq, seq, 8, 4}, 0.3, 4);
  Tensor expected = Tensor::empty(q.shape(), DType::kF32), out = Tensor::empty(q.shape(), DType::kF32);
  block_sparse_attention_forward(ctx, q, k, v, mask.view(), expected, TensorView{});
  ParallelAttention attention(groups, {1, seq, heads, kv_heads, dim, DType::kF32, Device::cpu(), 8, 4});
  EXPECT_EQ(attention.strategy(), ParallelStrategy::kLocal);
  attention.forward(ctx, q, k, v, out, attention.plan_mask(mask).get());
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.data_as<float>()[i], expected.data_as<float>()[i]) << i;
}

// One rank has neither neighbour: the exchange reads and writes nothing (the arguments are still checked).
TEST(SingleRankCommunicator, ANeighbourExchangeMovesNothing) {
  const ExecContext ctx;
  const auto world = make_single_rank_communicator(Device::cpu());
  Tensor to_previous = Tensor::empty({3}, DType::kF32), to_next = Tensor::empty({3}, DType::kF32);
  Tensor from_previous = Tensor::empty({3}, DType::kF32), from_next = Tensor::empty({3}, DType::kF32);
  fill(to_previous, 1.0f);
  fill(to_next, 2.0f);
  fill(from_previous, -1.0f);
  fill(from_next, -1.0f);
  world->neighbour_exchange(ctx, to_previous, to_next, from_previous, from_next);
  EXPECT_EQ(from_previous.data_as<float>()[2], -1.0f);
  EXPECT_EQ(from_next.data_as<float>()[0], -1.0f);
  Tensor shorter = Tensor::empty({2}, DType::kF32);
  EXPECT_NE(error_of([&] { world->neighbour_exchange(ctx, to_previous, to_next, shorter, from_next); }).find("from_previous"),
            std::string::npos);
}

TEST(MpiCommunicator, SaysWhenTesselWasBuiltWithoutMpi) {
  if (mpi_compiled()) GTEST_SKIP() << "built with MPI: the multi-process tests cover it";
  EXPECT_NE(error_of([] { make_mpi_world_communicator(); }).find("built without MPI"), std::string::npos);
}

}  // namespace
}  // namespace tessel
