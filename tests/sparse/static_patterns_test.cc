#include "tessel/sparse/planners/static_patterns.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "pattern_test_util.h"
#include "tessel/core/random.h"
#include "tessel/kernels/attention.h"
#include "tessel/sparse/planners/plan_cache.h"

namespace tessel {
namespace {

using testing::expect_error;
using testing::rows_of;
using Rows = std::vector<std::vector<int32_t>>;

StaticPlanRequest request(TokenGrid grid, int64_t bq, int64_t bkv, int64_t text = 0) {
  StaticPlanRequest r;
  r.layout.grid = grid;
  r.layout.text_tokens = text;
  r.block_q = bq;
  r.block_kv = bkv;
  return r;
}

TEST(StaticPatterns, SlidingWindowByHand) {
  const StaticPlan plan = plan_static_pattern(StaticPattern{SlidingWindowPattern{1}}, request({1, 1, 8}, 2, 2));
  EXPECT_EQ(rows_of(plan.mask), (Rows{{0, 1}, {0, 1, 2}, {1, 2, 3}, {2, 3}}));
  EXPECT_FALSE(plan.permuted());
}

TEST(StaticPatterns, LocalFramesByHand) {
  // 5 frames of 2 tokens, one frame per block; a window of 3 frames shifted inward at the ends.
  const StaticPlan plan = plan_static_pattern(StaticPattern{LocalPattern{3}}, request({5, 1, 2}, 2, 2));
  EXPECT_EQ(rows_of(plan.mask), (Rows{{0, 1, 2}, {0, 1, 2}, {1, 2, 3}, {2, 3, 4}, {2, 3, 4}}));
  // A window wider than the video keeps everything.
  EXPECT_DOUBLE_EQ(plan_static_pattern(StaticPattern{LocalPattern{9}}, request({5, 1, 2}, 2, 2)).mask.density(), 1.0);
}

TEST(StaticPatterns, RadialFrameSelectionByHand) {
  // T = 4 tokens per frame, block 4: base 2^3 = 8. d=2,3: L0 = 2 < 4, split 2 -> d=2 kept;
  // d=4..7: L0 = 1, split 4 -> d=4 kept. Windows are clamped up to the block (whole frame).
  const StaticPlan with_sink = plan_static_pattern(StaticPattern{RadialPattern{1.0, true}}, request({8, 1, 4}, 4, 4));
  const Rows rows = rows_of(with_sink.mask);
  EXPECT_EQ(rows[7], (std::vector<int32_t>{0, 3, 5, 6, 7}));
  EXPECT_EQ(rows[0], (std::vector<int32_t>{0, 1, 2, 4}));
  EXPECT_EQ(rows[4], (std::vector<int32_t>{0, 2, 3, 4, 5, 6}));
  const StaticPlan no_sink = plan_static_pattern(StaticPattern{RadialPattern{1.0, false}}, request({8, 1, 4}, 4, 4));
  EXPECT_EQ(rows_of(no_sink.mask)[7], (std::vector<int32_t>{3, 5, 6, 7}));
}

TEST(StaticPatterns, RadialWindowShrinksWithDecay) {
  // T = 16, block 4: base 32; d = 2, 3 -> L0 = 8, window 8·decay (at least the block, 4).
  // q block 12 = frame 3 tokens p = 0..3: frames 2, 3 dense (kv blocks 8..15); frames 0, 1 keep
  // p' <= 3 + 8 = 11 -> 3 blocks each (decay 1) or p' <= 3 + 4 -> 2 blocks (decay 0.5).
  const Rows full = rows_of(plan_static_pattern(StaticPattern{RadialPattern{1.0, false}}, request({4, 1, 16}, 4, 4)).mask);
  EXPECT_EQ(full[12], (std::vector<int32_t>{0, 1, 2, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15}));
  const Rows half = rows_of(plan_static_pattern(StaticPattern{RadialPattern{0.5, false}}, request({4, 1, 16}, 4, 4)).mask);
  EXPECT_EQ(half[12], (std::vector<int32_t>{0, 1, 4, 5, 8, 9, 10, 11, 12, 13, 14, 15}));
}

TEST(StaticPatterns, Window3dByHand) {
  // 2 frames of 3x3, token-level blocks, radii (0, 1, 1).
  const Rows rows = rows_of(plan_static_pattern(StaticPattern{SlidingWindow3dPattern{0, 1, 1}}, request({2, 3, 3}, 1, 1)).mask);
  EXPECT_EQ(rows[0], (std::vector<int32_t>{0, 1, 3, 4}));
  EXPECT_EQ(rows[4], (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(rows[17], (std::vector<int32_t>{13, 14, 16, 17}));
}

TEST(StaticPatterns, ArrowByHand) {
  // [2 text | 4 image], token blocks; inner keeps only the token itself.
  const StaticPattern arrow = make_arrow(StaticPattern{SlidingWindow3dPattern{0, 0, 0}});
  const Rows rows = rows_of(plan_static_pattern(arrow, request({1, 1, 4}, 1, 1, 2)).mask);
  EXPECT_EQ(rows[0], (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(rows[1], (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(rows[2], (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(rows[5], (std::vector<int32_t>{0, 1, 5}));
  // Text after the image.
  StaticPlanRequest last = request({1, 1, 4}, 1, 1, 2);
  last.layout.text_first = false;
  const Rows rows_last = rows_of(plan_static_pattern(arrow, last).mask);
  EXPECT_EQ(rows_last[0], (std::vector<int32_t>{0, 4, 5}));
  EXPECT_EQ(rows_last[4], (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  expect_error([&] { plan_static_pattern(arrow, request({1, 1, 4}, 1, 1, 0)); }, "text_tokens");
}

TEST(StaticPatterns, TextOutsideArrowSeesOnlyText) {
  const Rows rows = rows_of(plan_static_pattern(StaticPattern{LocalPattern{1}}, request({2, 1, 2}, 1, 1, 2)).mask);
  EXPECT_EQ(rows[0], (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(rows[2], (std::vector<int32_t>{2, 3}));
  StaticPlanRequest keep_text = request({2, 1, 2}, 1, 1, 2);
  keep_text.keep.text = true;
  const Rows widened = rows_of(plan_static_pattern(StaticPattern{LocalPattern{1}}, keep_text).mask);
  EXPECT_EQ(widened[0], (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(widened[4], (std::vector<int32_t>{0, 1, 4, 5}));
}

TEST(StaticPatterns, CompositeUnionAndIntersection) {
  const StaticPattern a{SlidingWindowPattern{1}};
  const StaticPattern b{LocalPattern{1}};  // grid 4x1x2: frames of 2 tokens
  const StaticPlanRequest r = request({4, 1, 2}, 2, 2);
  const std::vector<uint8_t> da = plan_static_pattern(a, r).mask.to_dense();
  const std::vector<uint8_t> db = plan_static_pattern(b, r).mask.to_dense();
  const std::vector<uint8_t> du = plan_static_pattern(make_composite(CompositeOp::kUnion, {a, b}), r).mask.to_dense();
  const std::vector<uint8_t> di = plan_static_pattern(make_composite(CompositeOp::kIntersection, {a, b}), r).mask.to_dense();
  for (size_t i = 0; i < da.size(); ++i) {
    EXPECT_EQ(du[i], da[i] | db[i]);
    EXPECT_EQ(di[i], da[i] & db[i]);
  }
  const StaticPattern hil{SpatialAwarePattern{1, 2, SpatialOrdering::kHilbert}};
  const StaticPattern z{SpatialAwarePattern{1, 2, SpatialOrdering::kZCurve}};
  expect_error([&] { plan_static_pattern(make_composite(CompositeOp::kUnion, {hil, z}), request({1, 4, 4}, 2, 2)); }, "ordering");
  expect_error([&] { plan_static_pattern(make_composite(CompositeOp::kUnion, {}), r); }, "composite.children");
}

TEST(StaticPatterns, AlwaysKeepDiagonalAndSinks) {
  StaticPlanRequest r = request({6, 4, 4}, 16, 8);
  r.keep.diagonal = true;
  r.keep.sink_blocks = 2;
  for (const StaticPattern& p : {StaticPattern{SlidingWindowPattern{0}}, StaticPattern{RadialPattern{0.25, false}},
                                 StaticPattern{SpatialAwarePattern{0, 2, SpatialOrdering::kHilbert}}}) {
    const StaticPlan plan = plan_static_pattern(p, r);
    for (int64_t qb = 0; qb < plan.mask.shape().q_blocks(); ++qb) {
      const std::vector<int32_t> row = plan.mask.row(0, 0, qb);
      for (int32_t kb : {0, 1, static_cast<int32_t>(2 * qb), static_cast<int32_t>(2 * qb + 1)})
        EXPECT_TRUE(std::binary_search(row.begin(), row.end(), kb)) << describe_static_pattern(p) << " row " << qb << " kb " << kb;
    }
  }
}

TEST(StaticPatterns, SymmetricPatternsGiveSymmetricMasks) {
  const StaticPlanRequest r = request({7, 6, 10}, 32, 32);
  for (const StaticPattern& p : {StaticPattern{SlidingWindowPattern{45}}, StaticPattern{SlidingWindow3dPattern{1, 2, 3}},
                                 StaticPattern{RadialPattern{0.5, false}}, StaticPattern{SpatialAwarePattern{2, 3, SpatialOrdering::kZCurve}}}) {
    const StaticPlan plan = plan_static_pattern(p, r);
    const int64_t n = plan.mask.shape().q_blocks();
    const std::vector<uint8_t> d = plan.mask.to_dense();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) EXPECT_EQ(d[i * n + j], d[j * n + i]) << describe_static_pattern(p) << " " << i << "," << j;
  }
}

TEST(StaticPatterns, DensityInExpectedRange) {
  // Sliding window of w tokens keeps at least (2w+1)/S of the pairs and at most that plus the
  // two blocks of rounding per row.
  const StaticPlanRequest r = request({1, 1, 4096}, 128, 64);
  const double density = plan_static_pattern(StaticPattern{SlidingWindowPattern{256}}, r).mask.density();
  EXPECT_GE(density, 513.0 / 4096.0);
  EXPECT_LE(density, (513.0 + 128 + 2 * 64) / 4096.0);
  // Radial on a Wan-like 21x30x52 grid is sparse but keeps the 3 nearest frames of 21 at least.
  const double radial = plan_static_pattern(StaticPattern{RadialPattern{}}, request({21, 30, 52}, 128, 64)).mask.density();
  EXPECT_GT(radial, 3.0 / 21.0);
  EXPECT_LT(radial, 0.6);
}

TEST(StaticPatterns, PerHeadPatterns) {
  const StaticPlan plan = plan_static_pattern({StaticPattern{SlidingWindowPattern{0}}, StaticPattern{DensePattern{}}}, request({1, 1, 8}, 2, 2));
  EXPECT_EQ(plan.mask.shape().mask_heads, 2);
  EXPECT_EQ(rows_of(plan.mask, 0), (Rows{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(rows_of(plan.mask, 1)[0], (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(StaticPatterns, SpatialAwareEqualsItsTokenRuleUnderThePermutation) {
  // Token-level blocks: kept(p, p') must equal the rule on the original tokens order[p], order[p'].
  const TokenGrid g{3, 5, 6};
  for (SpatialOrdering ordering : {SpatialOrdering::kRaster, SpatialOrdering::kHilbert, SpatialOrdering::kZCurve}) {
    for (int dims : {2, 3}) {
      const StaticPlan plan = plan_static_pattern(StaticPattern{SpatialAwarePattern{1, dims, ordering}}, request(g, 1, 1));
      const int64_t n = g.numel();
      const std::vector<uint8_t> d = plan.mask.to_dense();
      for (int64_t p = 0; p < n; ++p)
        for (int64_t p2 = 0; p2 < n; ++p2) {
          const int64_t i = plan.permuted() ? plan.permutation.order[p] : p;
          const int64_t j = plan.permuted() ? plan.permutation.order[p2] : p2;
          const int64_t df = std::abs(i / 30 - j / 30), dy = std::abs((i / 6) % 5 - (j / 6) % 5), dx = std::abs(i % 6 - j % 6);
          const bool keep = dims == 2 ? (df == 0 && dy <= 1 && dx <= 1) : (df <= 1 && dy <= 1 && dx <= 1);
          ASSERT_EQ(d[p * n + p2], keep ? 1 : 0) << p << "," << p2;
        }
    }
  }
}

TEST(StaticPatterns, PermutedPlansAreRasterPlansMappedThroughThePermutation) {
  // Token-level blocks: under a permutation, kept(p, p') == raster kept(order[p], order[p']).
  StaticPlanRequest r = request({5, 4, 6}, 1, 1, 7);
  const StaticPattern hilbert{SpatialAwarePattern{1, 3, SpatialOrdering::kHilbert}};
  const StaticPattern raster{SpatialAwarePattern{1, 3, SpatialOrdering::kRaster}};
  std::vector<std::pair<StaticPattern, StaticPattern>> cases = {{make_arrow(hilbert), make_arrow(raster)}};
  for (const StaticPattern& other : {StaticPattern{RadialPattern{0.5, true}}, StaticPattern{LocalPattern{2}}, StaticPattern{DensePattern{}},
                                     StaticPattern{SlidingWindowPattern{9}}})
    cases.push_back({make_composite(CompositeOp::kUnion, {other, hilbert}), make_composite(CompositeOp::kUnion, {other, raster})});
  for (bool text_first : {true, false}) {
    r.layout.text_first = text_first;
    for (const auto& [with_order, without] : cases) {
      const StaticPlan permuted = plan_static_pattern(with_order, r);
      const StaticPlan plain = plan_static_pattern(without, r);
      ASSERT_TRUE(permuted.permuted());
      const int64_t n = r.layout.seq_len();
      const std::vector<uint8_t> dp = permuted.mask.to_dense(), dr = plain.mask.to_dense();
      for (int64_t p = 0; p < n; ++p)
        for (int64_t p2 = 0; p2 < n; ++p2)
          ASSERT_EQ(dp[p * n + p2], dr[permuted.permutation.order[p] * n + permuted.permutation.order[p2]])
              << describe_static_pattern(with_order) << " text_first " << text_first << " at " << p << "," << p2;
    }
  }
}

TEST(StaticPatterns, HilbertOrderingMakesNeighbourhoodsDenserInBlocks) {
  // 128x128 patches, blocks of 64 tokens, radius 4: raster blocks are half rows, so a block's
  // neighbourhood spans 9 rows x 2 blocks; Hilbert blocks are 8x8 squares, 3x3 of them.
  const StaticPlanRequest r = request({1, 128, 128}, 64, 64);
  const double raster = plan_static_pattern(StaticPattern{SpatialAwarePattern{4, 2, SpatialOrdering::kRaster}}, r).mask.density();
  const double hilbert = plan_static_pattern(StaticPattern{SpatialAwarePattern{4, 2, SpatialOrdering::kHilbert}}, r).mask.density();
  EXPECT_LT(hilbert, raster * 0.75) << "raster " << raster << " hilbert " << hilbert;
}

TEST(StaticPatterns, PermuteAttendUnpermuteEqualsMaskMappedBack) {
  const TokenGrid g{2, 6, 6};
  const StaticPlan plan = plan_static_pattern(StaticPattern{SpatialAwarePattern{1, 3, SpatialOrdering::kHilbert}}, request(g, 8, 8));
  ASSERT_TRUE(plan.permuted());
  const int64_t n = g.numel(), heads = 2, dim = 16;
  Tensor q = Tensor::empty({1, n, heads, dim}, DType::kF32), k = Tensor::empty({1, n, heads, dim}, DType::kF32),
         v = Tensor::empty({1, n, heads, dim}, DType::kF32);
  fill_normal(q.view(), 1);
  fill_normal(k.view(), 2);
  fill_normal(v.view(), 3);
  Tensor qp = Tensor::empty(q.shape(), DType::kF32), kp = Tensor::empty(q.shape(), DType::kF32), vp = Tensor::empty(q.shape(), DType::kF32),
         op = Tensor::empty(q.shape(), DType::kF32), out = Tensor::empty(q.shape(), DType::kF32);
  permute_tokens(q.view(), qp.view(), plan.permutation);
  permute_tokens(k.view(), kp.view(), plan.permutation);
  permute_tokens(v.view(), vp.view(), plan.permutation);
  fill(op.view(), NAN);
  block_sparse_attention_forward(ExecContext{}, qp.view(), kp.view(), vp.view(), plan.mask.view(), op.view(), TensorView{});
  unpermute_tokens(op.view(), out.view(), plan.permutation);
  // fp64 attention in the original order, keeping (i, j) iff the mask keeps their permuted blocks.
  const float* qd = q.data_as<float>();
  const float* kd = k.data_as<float>();
  const float* vd = v.data_as<float>();
  const std::vector<uint8_t> dense = plan.mask.to_dense();
  const int64_t kvbs = plan.mask.shape().kv_blocks();
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < n; ++i) {
      std::vector<double> w(n, 0.0);
      double mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        if (!dense[(plan.permutation.inverse[i] / 8) * kvbs + plan.permutation.inverse[j] / 8]) {
          w[j] = -INFINITY;
          continue;
        }
        double s = 0.0;
        for (int64_t d = 0; d < dim; ++d) s += double(qd[(i * heads + h) * dim + d]) * kd[(j * heads + h) * dim + d];
        w[j] = s / std::sqrt(double(dim));
        mx = std::max(mx, w[j]);
      }
      double total = 0.0;
      for (double& x : w) total += (x = std::isinf(x) ? 0.0 : std::exp(x - mx));
      for (int64_t d = 0; d < dim; ++d) {
        double o = 0.0;
        for (int64_t j = 0; j < n; ++j) o += w[j] * vd[(j * heads + h) * dim + d];
        EXPECT_NEAR(out.data_as<float>()[(i * heads + h) * dim + d], o / total, 2e-5) << "token " << i << " head " << h;
      }
    }
}

TEST(StaticPatterns, InvalidParametersAreErrors) {
  const StaticPlanRequest r = request({2, 4, 4}, 4, 4);
  expect_error([&] { plan_static_pattern(StaticPattern{SlidingWindowPattern{-1}}, r); }, "sliding_window.window");
  expect_error([&] { plan_static_pattern(StaticPattern{SpatialAwarePattern{1, 4}}, r); }, "spatial_aware.dims");
  expect_error([&] { plan_static_pattern(StaticPattern{RadialPattern{0.0}}, r); }, "radial.decay_factor");
  expect_error([&] { plan_static_pattern(StaticPattern{LocalPattern{0}}, r); }, "local.local_window_size");
  expect_error([&] { plan_static_pattern(StaticPattern{DensePattern{}}, request({0, 4, 4}, 4, 4)); }, "grid");
  expect_error([&] { plan_static_pattern(StaticPattern{DensePattern{}}, request({1, 4, 4}, 0, 4)); }, "block_q");
}

TEST(StaticPlanCache, PlansOncePerShape) {
  StaticPlanCache cache;
  const StaticPattern radial{RadialPattern{}};
  auto a = cache.get(radial, request({4, 8, 8}, 64, 64));
  auto b = cache.get(radial, request({4, 8, 8}, 64, 64));
  EXPECT_EQ(a.get(), b.get());
  auto c = cache.get(radial, request({5, 8, 8}, 64, 64));
  EXPECT_NE(a.get(), c.get());
  auto d = cache.get(StaticPattern{RadialPattern{0.5}}, request({4, 8, 8}, 64, 64));
  EXPECT_NE(a.get(), d.get());
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.misses(), 3);
}

}  // namespace
}  // namespace tessel
