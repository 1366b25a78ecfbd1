#include "tessel/sparse/planners/ordering.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "pattern_test_util.h"

namespace tessel {
namespace {

TEST(TokenOrdering, ZCurveByHand) {
  const TokenPermutation p = make_token_permutation(TokenLayout{{1, 4, 4}, 0, true}, SpatialOrdering::kZCurve);
  EXPECT_EQ(p.order, (std::vector<int32_t>{0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15}));
}

TEST(TokenOrdering, HilbertStepsAreNeighbours) {
  const TokenPermutation p = make_token_permutation(TokenLayout{{1, 8, 8}, 0, true}, SpatialOrdering::kHilbert);
  for (size_t i = 1; i < p.order.size(); ++i) {
    const int a = p.order[i - 1], b = p.order[i];
    EXPECT_EQ(std::abs(a / 8 - b / 8) + std::abs(a % 8 - b % 8), 1) << "step " << i;
  }
}

TEST(TokenOrdering, EveryOrderingIsAPermutationKeepingFramesAndText) {
  for (SpatialOrdering o : {SpatialOrdering::kRaster, SpatialOrdering::kHilbert, SpatialOrdering::kZCurve}) {
    for (bool text_first : {true, false}) {
      const TokenLayout layout{{3, 5, 7}, 4, text_first};
      const TokenPermutation p = make_token_permutation(layout, o);
      EXPECT_NO_THROW(validate_token_permutation(p, layout.seq_len(), "p"));
      std::vector<int32_t> sorted = p.order;
      std::sort(sorted.begin(), sorted.end());
      for (size_t i = 0; i < sorted.size(); ++i) EXPECT_EQ(sorted[i], static_cast<int32_t>(i));
      for (int64_t pos = 0; pos < layout.seq_len(); ++pos) {
        const int64_t n = pos - layout.image_offset();
        if (n < 0 || n >= 105) {
          EXPECT_EQ(p.order[pos], pos) << "text token moved";
        } else {
          EXPECT_EQ((p.order[pos] - layout.image_offset()) / 35, n / 35) << "token left its frame";
        }
      }
      EXPECT_EQ(p.is_identity(), o == SpatialOrdering::kRaster);
    }
  }
}

TEST(TokenOrdering, PermuteRoundTripsAndRejectsBadInput) {
  const TokenPermutation p = make_token_permutation(TokenLayout{{1, 3, 3}, 0, true}, SpatialOrdering::kHilbert);
  Tensor x = Tensor::empty({2, 9, 2, 3}, DType::kF32), y = Tensor::empty({2, 9, 2, 3}, DType::kF32), z = Tensor::empty({2, 9, 2, 3}, DType::kF32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = static_cast<float>(i);
  permute_tokens(x.view(), y.view(), p);
  EXPECT_EQ(y.data_as<float>()[1 * 6], x.data_as<float>()[p.order[1] * 6]);
  unpermute_tokens(y.view(), z.view(), p);
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(z.data_as<float>()[i], x.data_as<float>()[i]);
  Tensor wrong = Tensor::empty({2, 8, 2, 3}, DType::kF32);
  testing::expect_error([&] { permute_tokens(x.view(), wrong.view(), p); }, "dst");
  TokenPermutation broken = p;
  broken.inverse[0] = 5;
  testing::expect_error([&] { permute_tokens(x.view(), y.view(), broken); }, "permutation");
}

TEST(TokenLayout, ParsesGrids) {
  EXPECT_EQ(parse_token_grid("21x30x52"), (TokenGrid{21, 30, 52}));
  EXPECT_EQ(parse_token_grid("16x8"), (TokenGrid{1, 16, 8}));
  testing::expect_error([] { parse_token_grid("3x0x4"); }, "FxHxW");
  testing::expect_error([] { parse_token_grid("3xx4"); }, "FxHxW");
  testing::expect_error([] { parse_token_grid("1x2x3x4"); }, "FxHxW");
}

}  // namespace
}  // namespace tessel
