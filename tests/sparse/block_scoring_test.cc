// The shared block-scoring functions: antidiagonal masses against their definition, and each
// selection rule with always-kept blocks, ties and the column vote.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/sparse/estimators/block_scoring.h"

namespace tessel {
namespace {

using Keep = std::vector<uint8_t>;

TEST(BlockScoring, ReverseStrideGroupsReversesTokensWithinEachGroup) {
  // 2 groups of stride 3, dim 2: token t holds (t, 10 + t).
  std::vector<float> rows, out(12);
  for (int t = 0; t < 6; ++t) rows.insert(rows.end(), {float(t), float(10 + t)});
  block_scoring::reverse_stride_groups(rows.data(), 2, 3, 2, out.data());
  EXPECT_EQ(out, (std::vector<float>{2, 12, 1, 11, 0, 10, 5, 15, 4, 14, 3, 13}));
}

TEST(BlockScoring, AntidiagonalMassIsTheSoftmaxSummedPerBlock) {
  // 5 rows and 6 columns of width 3 (the tiled kernel's partial 4-tiles on both sides);
  // columns 0-1 -> block 0, 2-4 -> block 1, 5 -> block 2.
  const int64_t rows = 5, columns = 6, width = 3;
  std::vector<float> q(rows * width), k(columns * width);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.7f * float(i));
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(1.3f * float(i));
  const std::vector<int32_t> column_block = {0, 0, 1, 1, 1, 2};
  const float scale = 0.5f;
  std::vector<double> mass(3, 0.0);
  block_scoring::add_antidiagonal_mass(q.data(), rows, k.data(), columns, width, scale, column_block, mass);
  std::vector<double> want(3, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> e(columns);
    double total = 0;
    for (int64_t c = 0; c < columns; ++c) {
      double dot = 0;
      for (int64_t i = 0; i < width; ++i) dot += double(q[r * width + i]) * double(k[c * width + i]);
      total += (e[c] = std::exp(dot * scale));
    }
    for (int64_t c = 0; c < columns; ++c) want[column_block[c]] += e[c] / total;
  }
  for (int b = 0; b < 3; ++b) EXPECT_NEAR(mass[b], want[b], 1e-6) << b;
  EXPECT_NEAR(mass[0] + mass[1] + mass[2], double(rows), 1e-6);
}

TEST(BlockScoring, TopKChoosesAmongTheBlocksNotAlreadyKept) {
  const std::vector<float> score = {0.9f, 0.1f, 0.5f, 0.5f, 0.3f};
  Keep keep = {1, 0, 0, 0, 0};  // block 0 is always kept: it is not one of the k
  block_scoring::keep_top_k(score.data(), 5, 2, keep.data());
  EXPECT_EQ(keep, (Keep{1, 0, 1, 1, 0}));  // equal scores: the lower index first, both fit
  Keep one = {0, 0, 0, 0, 0};
  block_scoring::keep_top_k(score.data(), 5, 2, one.data());
  EXPECT_EQ(one, (Keep{1, 0, 1, 0, 0}));  // tie 2 / 3 goes to 2
  const std::vector<double> fp64 = {1.0, 3.0, 2.0};
  Keep all = {0, 0, 0};
  block_scoring::keep_top_k(fp64.data(), 3, 7, all.data());  // k beyond the blocks: all of them
  EXPECT_EQ(all, (Keep{1, 1, 1}));
}

TEST(BlockScoring, CdfKeepsTheFewestReachingP) {
  const std::vector<float> p = {0.1f, 0.4f, 0.3f, 0.2f};
  Keep keep(4, 0);
  block_scoring::keep_until_cdf(p.data(), 4, 0.65, keep.data());
  EXPECT_EQ(keep, (Keep{0, 1, 1, 0}));
  Keep at_least_one(4, 0);
  block_scoring::keep_until_cdf(p.data(), 4, 0.01, at_least_one.data());
  EXPECT_EQ(at_least_one, (Keep{0, 1, 0, 0}));
}

TEST(BlockScoring, TauCountsAlwaysKeptMassFirst) {
  const std::vector<float> mass = {0.5f, 0.3f, 0.15f, 0.05f};
  Keep plain(4, 0);
  block_scoring::keep_until_mass(mass.data(), 4, 0.7, plain.data());
  EXPECT_EQ(plain, (Keep{1, 1, 0, 0}));
  Keep forced = {0, 0, 1, 1};  // 0.2 already kept: 0.5 more reaches 0.7
  block_scoring::keep_until_mass(mass.data(), 4, 0.7, forced.data());
  EXPECT_EQ(forced, (Keep{1, 0, 1, 1}));
}

TEST(BlockScoring, SinkAndRecentAlwaysKeep) {
  AlwaysKeep always;
  always.sink_blocks = 2;
  always.recent_blocks = 1;
  Keep keep(5, 0);
  block_scoring::keep_sink_and_recent(always, 5, keep.data());
  EXPECT_EQ(keep, (Keep{1, 1, 0, 0, 1}));
  always.recent_blocks = 9;  // more than the row: every block, no out-of-range write
  Keep small(3, 0);
  block_scoring::keep_sink_and_recent(always, 3, small.data());
  EXPECT_EQ(small, (Keep{1, 1, 1}));
  // The same rule on a mask: every row of a 2 x 4 block map keeps its last kv block.
  AlwaysKeep recent;
  recent.recent_blocks = 1;
  const BlockMaskShape shape{1, 1, 256, 256, 128, 64};
  Keep dense(static_cast<size_t>(2 * 4), 0);
  apply_always_keep(shape, recent, nullptr, dense);
  EXPECT_EQ(dense, (Keep{0, 0, 0, 1, 0, 0, 0, 1}));
  recent.recent_blocks = -1;
  EXPECT_THROW(apply_always_keep(shape, recent, nullptr, dense), Error);
}

TEST(BlockScoring, GqaAnyAndColumnVote) {
  // 1 batch, 4 query heads over 2 kv heads, plane of 1 row x 4 columns.
  const Keep per_head = {1, 0, 0, 0,  0, 1, 0, 0,  0, 0, 1, 0,  0, 0, 1, 0};
  const Keep merged = block_scoring::merge_gqa_any(per_head, 1, 4, 2, 4);
  EXPECT_EQ(merged, (Keep{1, 1, 0, 0, 0, 0, 1, 0}));
  // Vote over 4 rows: column 1 has 3 votes, column 2 has 2 (not more than half).
  const Keep rows = {0, 1, 1, 0,  0, 1, 0, 0,  0, 1, 1, 0,  0, 0, 0, 0};
  AlwaysKeep ends;
  ends.sink_blocks = 1;
  ends.recent_blocks = 1;
  EXPECT_EQ(block_scoring::vote_columns(rows, 4, 4, 0.5, ends), (Keep{1, 1, 0, 1}));
  EXPECT_EQ(block_scoring::vote_columns(rows, 4, 4, 0.25, AlwaysKeep{}), (Keep{0, 1, 1, 0}));
}

}  // namespace
}  // namespace tessel
