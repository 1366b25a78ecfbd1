#include "tessel/sparse/block_mask.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "tessel/core/device.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {

template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

// 2 heads x 2 q blocks of 4 tokens; 3 kv blocks (last partial: 10 keys in blocks of 4).
const BlockMaskShape kShape{1, 2, 8, 10, 4, 4};

TEST(BlockMask, ValidationNamesTheRow) {
  expect_error([] { BlockMask::from_csr(kShape, {0, 1, 2, 3}, {0, 1, 2}); }, "indptr: expected 5 entries");
  expect_error([] { BlockMask::from_csr(kShape, {1, 1, 2, 3, 4}, {0, 1, 2, 0}); }, "indptr[0]");
  expect_error([] { BlockMask::from_csr(kShape, {0, 1, 2, 3, 5}, {0, 1, 2, 0}); }, "indptr[num_rows]");
  expect_error([] { BlockMask::from_csr(kShape, {0, 2, 1, 3, 4}, {0, 1, 2, 0}); },
               "mask row (batch 0, head 0, q_block 1): indptr decreases");
  expect_error([] { BlockMask::from_csr(kShape, {0, 1, 3, 4, 5}, {0, 2, 1, 0, 0}); },
               "mask row (batch 0, head 0, q_block 1): kv block indices not sorted (2 before 1)");
  expect_error([] { BlockMask::from_csr(kShape, {0, 1, 2, 4, 5}, {0, 0, 1, 1, 2}); },
               "mask row (batch 0, head 1, q_block 0): duplicate kv block index 1");
  expect_error([] { BlockMask::from_csr(kShape, {0, 1, 2, 3, 4}, {0, 0, 0, 3}); },
               "mask row (batch 0, head 1, q_block 1): kv block index 3 out of range [0, 3)");
  expect_error([] { BlockMask::from_csr(kShape, {0, 1, 2, 3, 4}, {0, 0, -1, 0}); }, "kv block index -1");
  expect_error([] { BlockMask::full({1, 1, 8, 8, 0, 4}); }, "block_q");
  expect_error([] { BlockMask::random(kShape, 0.0, 1); }, "density");
  expect_error([] { BlockMask::from_dense(kShape, std::vector<uint8_t>(5)); }, "dense");
}

TEST(BlockMask, ShapesWhoseBlockCountOverflowsAreAnErrorNotUndefinedBehaviour) {
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  expect_error([] { BlockMask::full({1, 1, kHuge, kHuge, 8, 8}); }, "at most 2^31-1 blocks");
  expect_error([] { BlockMask::full({int64_t{1} << 40, int64_t{1} << 40, 16, 16, 8, 8}); }, "(batch, head) rows");
  // No q block, so no block at all, but one FlashInfer entry per (batch, head) pair.
  expect_error([] { BlockMask::full({1, int64_t{1} << 57, 0, 16, 8, 8}); }, "(batch, head) rows");
  EXPECT_EQ((BlockMaskShape{1, 1, kHuge, 1, kHuge, 1}.q_blocks()), 1);
}

TEST(BlockMask, DensityAndTokenDensity) {
  const BlockMask m = BlockMask::from_rows(kShape, {{0, 2}, {1}, {}, {0, 1, 2}});
  EXPECT_EQ(m.nnz(), 6);
  EXPECT_DOUBLE_EQ(m.density(), 6.0 / 12.0);
  // Kept token pairs: row0 4*(4+2), row1 4*4, row3 4*10 = 24 + 16 + 40 = 80 of 2*8*10 = 160.
  EXPECT_DOUBLE_EQ(m.token_density(), 80.0 / 160.0);
  EXPECT_EQ(m.row(0, 1, 1), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_TRUE(m.row(0, 1, 0).empty());
  EXPECT_THROW(m.row(0, 2, 0), Error);
  EXPECT_DOUBLE_EQ(BlockMask::full(kShape).density(), 1.0);
  EXPECT_DOUBLE_EQ(BlockMask::full(kShape).token_density(), 1.0);
}

TEST(BlockMask, ConversionsRoundTrip) {
  const BlockMask m = BlockMask::from_rows(kShape, {{0, 2}, {1}, {}, {0, 1, 2}});
  const auto dense = m.to_dense();
  EXPECT_EQ(dense, (std::vector<uint8_t>{1, 0, 1, 0, 1, 0, 0, 0, 0, 1, 1, 1}));
  const BlockMask from_dense = BlockMask::from_dense(kShape, dense);
  EXPECT_EQ(from_dense.indptr(), m.indptr());
  EXPECT_EQ(from_dense.indices(), m.indices());

  const auto fi = m.to_flashinfer();
  ASSERT_EQ(fi.size(), 2u);
  EXPECT_EQ(fi[1].indptr, (std::vector<int32_t>{0, 0, 3}));
  EXPECT_EQ(fi[1].indices, (std::vector<int32_t>{0, 1, 2}));
  const BlockMask from_fi = BlockMask::from_flashinfer(kShape, fi);
  EXPECT_EQ(from_fi.indptr(), m.indptr());
  EXPECT_EQ(from_fi.indices(), m.indices());

  const auto flex = m.to_flex();
  EXPECT_EQ(flex.kv_num_blocks, (std::vector<int32_t>{2, 1, 0, 3}));
  EXPECT_EQ(flex.kv_indices, (std::vector<int32_t>{0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 1, 2}));
  const BlockMask from_flex = BlockMask::from_flex(kShape, flex);
  EXPECT_EQ(from_flex.indices(), m.indices());
  FlexBlockMask bad = flex;
  bad.kv_num_blocks[2] = 4;
  expect_error([&] { BlockMask::from_flex(kShape, bad); }, "mask row (batch 0, head 1, q_block 0): kv_num_blocks 4");
  bad = flex;
  bad.kv_indices[1] = 0;  // row 0 becomes {0, 0}
  expect_error([&] { BlockMask::from_flex(kShape, bad); }, "duplicate");
}

TEST(BlockMask, RandomKeepsDensityAndDiagonal) {
  // S_q = 300 < S_kv = 1000: bottom-right alignment shifts the diagonal by 700 keys.
  const BlockMaskShape shape{2, 3, 300, 1000, 64, 32};
  for (double density : {0.05, 0.25, 0.5, 1.0}) {
    const BlockMask m = BlockMask::random(shape, density, 42);
    const int64_t kvb = shape.kv_blocks(), target = std::max<int64_t>(1, std::llround(density * kvb));
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 3; ++h)
        for (int64_t qb = 0; qb < shape.q_blocks(); ++qb) {
          const auto row = m.row(b, h, qb);
          const int64_t first = qb * 64 + 700, last = std::min<int64_t>(300, qb * 64 + 64) - 1 + 700;
          for (int64_t j = first / 32; j <= last / 32; ++j)
            EXPECT_NE(std::find(row.begin(), row.end(), j), row.end()) << "diagonal block " << j << " missing";
          EXPECT_EQ(static_cast<int64_t>(row.size()), std::max<int64_t>(target, last / 32 - first / 32 + 1));
        }
    EXPECT_NEAR(m.density(), density, 0.05);
  }
  // Same seed, same mask; different seed, different mask.
  EXPECT_EQ(BlockMask::random(shape, 0.3, 1).indices(), BlockMask::random(shape, 0.3, 1).indices());
  EXPECT_NE(BlockMask::random(shape, 0.3, 1).indices(), BlockMask::random(shape, 0.3, 2).indices());
}

TEST(BlockMask, ViewAndDeviceCopy) {
  const BlockMask m = BlockMask::from_rows(kShape, {{0, 2}, {1}, {}, {0, 1, 2}});
  const BlockMaskView v = m.view();
  EXPECT_EQ(v.q_blocks, 2);
  EXPECT_EQ(v.kv_blocks, 3);
  EXPECT_EQ(v.mask_heads, 2);
  EXPECT_EQ(v.indptr[v.row(0, 1, 1)], 3);
  const auto host = m.to_device(Device::cpu());
  EXPECT_EQ(host.view().indices[4], 1);
  EXPECT_TRUE(host.view().device.is_cpu());
  if (!cuda_compiled()) expect_error([&] { m.to_device(Device::cuda(0)); }, "without CUDA");
}

}  // namespace
}  // namespace tessel
