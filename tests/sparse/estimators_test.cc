#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "pattern_test_util.h"
#include "tessel/core/random.h"
#include "tessel/sparse/estimators/topk_estimator.h"
#include "tessel/sparse/estimators/xattention_estimator.h"

namespace tessel {
namespace {

using testing::expect_error;

// q blocks of 16 tokens, kv blocks of 16; q block r is planted on kv block planted(r): its
// queries share a direction u_r that the keys of that kv block carry strongly.
struct Planted {
  Tensor q, k;
  std::vector<int32_t> target;
};

Planted planted(int64_t blocks, int64_t heads, int64_t dim, DType dtype = DType::kF32) {
  const int64_t seq = blocks * 16;
  Tensor q = Tensor::empty({1, seq, heads, dim}, DType::kF32), k = Tensor::empty({1, seq, heads, dim}, DType::kF32);
  fill_normal(q.view(), 11, 0.0, 0.3);
  fill_normal(k.view(), 12, 0.0, 0.3);
  Tensor dirs = Tensor::empty({blocks, dim}, DType::kF32);
  fill_normal(dirs.view(), 13);
  Planted p;
  for (int64_t r = 0; r < blocks; ++r) p.target.push_back(static_cast<int32_t>((r * 5 + 3) % blocks));
  float* qd = q.data_as<float>();
  float* kd = k.data_as<float>();
  const float* u = dirs.data_as<float>();
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t r = 0; r < blocks; ++r)
      for (int64_t t = 0; t < 16; ++t)
        for (int64_t d = 0; d < dim; ++d) {
          qd[((r * 16 + t) * heads + h) * dim + d] += 1.5f * u[r * dim + d];
          kd[((p.target[r] * 16 + t) * heads + h) * dim + d] += 1.5f * u[r * dim + d];
        }
  p.q = dtype == DType::kF32 ? std::move(q) : q.to(dtype);
  p.k = dtype == DType::kF32 ? std::move(k) : k.to(dtype);
  return p;
}

bool keeps(const BlockMask& m, int64_t head, int64_t row, int32_t kb) {
  const std::vector<int32_t> r = m.row(0, head, row);
  return std::binary_search(r.begin(), r.end(), kb);
}

// Random q (B, S, Hq, D) and k (B, S, Hkv, D), and top-k options with blocks 32 x 16 and the
// self-similarity rule off (every block, partial ones too, is self-similar under the rounded
// rule), so rows keep exactly the top-k count.
struct RankingCase {
  Tensor q, k;
  TopkEstimatorOptions options;
};

RankingCase ranking_case(int64_t batch, int64_t seq, int64_t hq, int64_t hkv, int64_t dim, uint64_t seed) {
  RankingCase c{Tensor::empty({batch, seq, hq, dim}, DType::kF32), Tensor::empty({batch, seq, hkv, dim}, DType::kF32), {}};
  fill_normal(c.q.view(), seed);
  fill_normal(c.k.view(), seed + 1);
  c.options.block_q = 32;
  c.options.block_kv = 16;
  c.options.similarity_threshold = -2.0;
  c.options.rule = TopkRule::kReachTarget;
  return c;
}

TEST(TopkEstimator, KeepsExactlyTheRequestedCount) {
  RankingCase c = ranking_case(2, 200, 4, 2, 32, 1);  // 13 kv blocks, the last partial
  const Tensor& q = c.q;
  const Tensor& k = c.k;
  TopkEstimatorOptions& o = c.options;
  for (double ratio : {0.1, 0.25, 0.5, 1.0}) {
    o.topk_ratio = ratio;
    const EstimateResult r = estimate_topk_mask(ExecContext{}, q.view(), k.view(), o);
    EXPECT_EQ(r.mask.shape().mask_batch, 2);
    EXPECT_EQ(r.mask.shape().mask_heads, 4);
    const int64_t n = std::clamp<int64_t>(std::llround(ratio * 13), 1, 13);
    for (int64_t row = 0; row < r.mask.shape().num_rows(); ++row)
      EXPECT_EQ(r.mask.indptr()[row + 1] - r.mask.indptr()[row], n) << "ratio " << ratio << " row " << row;
    EXPECT_GE(r.estimate_ms, 0.0);
  }
}

TEST(TopkEstimator, PerHeadRatios) {
  RankingCase c = ranking_case(1, 160, 3, 3, 16, 3);  // 10 kv blocks
  const Tensor& q = c.q;
  const Tensor& k = c.k;
  TopkEstimatorOptions& o = c.options;
  o.per_head = {0.1, 0.5, 1.0};
  const BlockMask m = estimate_topk_mask(ExecContext{}, q.view(), k.view(), o).mask;
  for (int64_t h = 0; h < 3; ++h)
    for (int64_t r = 0; r < 5; ++r) EXPECT_EQ(m.row(0, h, r).size(), std::vector<size_t>({1, 5, 10})[h]) << "head " << h;
  o.per_head = {0.1, 0.5};
  expect_error([&] { estimate_topk_mask(ExecContext{}, q.view(), k.view(), o); }, "per_head");
  o.per_head = {0.1, 0.0, 1.0};
  expect_error([&] { estimate_topk_mask(ExecContext{}, q.view(), k.view(), o); }, "per_head[1]");
}

TEST(TopkEstimator, FindsPlantedBlocks) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const Planted p = planted(12, 2, 32, dtype);
    TopkEstimatorOptions o;
    o.block_q = 16;
    o.block_kv = 16;
    o.topk_ratio = 1.0 / 12.0;
    o.similarity_threshold = -2.0;
    const EstimateResult r = estimate_topk_mask(ExecContext{}, p.q.view(), p.k.view(), o);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t row = 0; row < 12; ++row) {
        EXPECT_TRUE(keeps(r.mask, h, row, p.target[row])) << "head " << h << " row " << row;
        EXPECT_EQ(r.mask.row(0, h, row).size(), 1u);
      }
    // cdf mode reaches the planted block first too.
    o.cdf_threshold = 0.3;
    const EstimateResult c = estimate_topk_mask(ExecContext{}, p.q.view(), p.k.view(), o);
    for (int64_t row = 0; row < 12; ++row) EXPECT_TRUE(keeps(c.mask, 0, row, p.target[row]));
  }
}

TEST(TopkEstimator, CdfModeKeepsMoreForHigherThresholds) {
  Tensor q = Tensor::empty({1, 256, 2, 16}, DType::kF32), k = Tensor::empty({1, 256, 2, 16}, DType::kF32);
  fill_normal(q.view(), 5);
  fill_normal(k.view(), 6);
  TopkEstimatorOptions o;
  o.block_q = 16;
  o.block_kv = 16;
  o.similarity_threshold = -2.0;
  int64_t last = 0;
  for (double cdf : {0.2, 0.5, 0.8, 0.99}) {
    o.cdf_threshold = cdf;
    const int64_t nnz = estimate_topk_mask(ExecContext{}, q.view(), k.view(), o).mask.nnz();
    EXPECT_GE(nnz, last);
    last = nnz;
  }
}

TEST(TopkEstimator, NonSelfSimilarBlocksAreKeptWhole) {
  // Random tokens have mean pairwise cosine ~ 1/n (< 0.1 threshold for n=64 only when high-dim):
  // make kv block 2 alternate +w/-w (mean cosine 0) while the others share a direction.
  const int64_t seq = 128, dim = 16;
  Tensor q = Tensor::empty({1, seq, 1, dim}, DType::kF32), k = Tensor::empty({1, seq, 1, dim}, DType::kF32);
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t d = 0; d < dim; ++d) {
      q.data_as<float>()[t * dim + d] = d == 0 ? 1.0f : 0.01f * static_cast<float>((t * 7 + d) % 5);
      const bool alternating = t / 16 == 2;
      k.data_as<float>()[t * dim + d] = alternating ? (d == 1 ? (t % 2 ? 1.0f : -1.0f) : 0.0f) : (d == 0 ? 1.0f : 0.0f);
    }
  // q block 1 (tokens 32..63): alternate too, so its whole row is kept.
  for (int64_t t = 32; t < 64; ++t)
    for (int64_t d = 0; d < dim; ++d) q.data_as<float>()[t * dim + d] = d == 2 ? (t % 2 ? 1.0f : -1.0f) : 0.0f;
  TopkEstimatorOptions o;
  o.block_q = 32;
  o.block_kv = 16;
  o.topk_ratio = 0.125;
  o.smooth_k = false;  // the keys share one direction on purpose: smoothing would remove it
  const EstimateResult r = estimate_topk_mask(ExecContext{}, q.view(), k.view(), o);
  for (int64_t row = 0; row < 4; ++row) EXPECT_TRUE(keeps(r.mask, 0, row, 2)) << "column of the non-similar k block, row " << row;
  EXPECT_EQ(r.mask.row(0, 0, 1).size(), 8u) << "row of the non-similar q block";
  EXPECT_EQ(r.mask.row(0, 0, 0).size(), 2u) << "top 1 plus the forced column";
}

TEST(TopkEstimator, RejectsBadInput) {
  Tensor q = Tensor::empty({1, 64, 2, 16}, DType::kF32), k = Tensor::empty({1, 64, 3, 16}, DType::kF32);
  expect_error([&] { estimate_topk_mask(ExecContext{}, q.view(), k.view(), {}); }, "k heads");
  Tensor k2 = Tensor::empty({1, 64, 2, 16}, DType::kF32);
  TopkEstimatorOptions o;
  o.topk_ratio = 0.0;
  expect_error([&] { estimate_topk_mask(ExecContext{}, q.view(), k2.view(), o); }, "topk_ratio");
  Tensor qi = Tensor::empty({1, 64, 2, 16}, DType::kI32);
  expect_error([&] { estimate_topk_mask(ExecContext{}, qi.view(), k2.view(), {}); }, "dtype");
}

// Steps 1-4 of the header straight from the definition, in fp64.
std::vector<double> mass_by_definition(const Tensor& q, const Tensor& k, int64_t stride, int64_t bq, int64_t bkv) {
  const int64_t seq_q = q.size(1), seq_kv = k.size(1), hq = q.size(2), hkv = k.size(2), dim = q.size(3);
  const int64_t gq = (seq_q + stride - 1) / stride, gk = (seq_kv + stride - 1) / stride;
  const int64_t qbs = (seq_q + bq - 1) / bq, kvbs = (seq_kv + bkv - 1) / bkv;
  std::vector<double> mass(static_cast<size_t>(hq * qbs * kvbs), 0.0);
  auto at = [](const Tensor& x, int64_t t, int64_t h, int64_t d) {
    return t < x.size(1) ? static_cast<double>(x.data_as<float>()[(t * x.size(2) + h) * x.size(3) + d]) : 0.0;
  };
  for (int64_t h = 0; h < hq; ++h)
    for (int64_t g = 0; g < gq; ++g) {
      std::vector<double> logit(gk);
      double mx = -INFINITY;
      for (int64_t g2 = 0; g2 < gk; ++g2) {
        double a = 0.0;
        for (int64_t i = 0; i < stride; ++i)
          for (int64_t d = 0; d < dim; ++d) a += at(q, g * stride + stride - 1 - i, h, d) * at(k, g2 * stride + i, h / (hq / hkv), d);
        logit[g2] = a / std::sqrt(double(dim)) / stride;
        mx = std::max(mx, logit[g2]);
      }
      double total = 0.0;
      for (double& x : logit) total += (x = std::exp(x - mx));
      for (int64_t g2 = 0; g2 < gk; ++g2) mass[(h * qbs + g * stride / bq) * kvbs + g2 * stride / bkv] += logit[g2] / total;
    }
  return mass;
}

// Random q (1, 100, 4, 8) and k (1, 90, 2, 8), and options for stride 8 and 32 x 16 blocks (the
// last kv block partial).
struct MassCase {
  Tensor q = Tensor::empty({1, 100, 4, 8}, DType::kF32), k = Tensor::empty({1, 90, 2, 8}, DType::kF32);
  XAttentionOptions options;
  explicit MassCase(XAttentionPadding padding) {
    fill_normal(q.view(), 3);
    fill_normal(k.view(), 4);
    options.stride = 8;
    options.block_q = 32;
    options.block_kv = 16;
    options.padding = padding;
  }
};

TEST(XAttentionEstimator, BlockMassMatchesTheDefinition) {
  const MassCase c(XAttentionPadding::kNone);
  const Tensor& q = c.q;
  const Tensor& k = c.k;
  const std::vector<float> got = xattention_block_mass(ExecContext{}, q.view(), k.view(), c.options);
  const std::vector<double> want = mass_by_definition(q, k, 8, 32, 16);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << i;
}

TEST(XAttentionEstimator, ChunkPaddingIsZeroKeysInTheSoftmax) {
  // 90 keys are padded to the official chunk (2048): the mass of the real blocks equals the
  // definition's over explicitly zero-padded keys, cut back to the real blocks.
  ASSERT_EQ(xattention_padded_length(90), 2048);
  ASSERT_EQ(xattention_padded_length(4680), 8192);
  ASSERT_EQ(xattention_padded_length(32760), 32768);
  const MassCase c(XAttentionPadding::kChunk);
  Tensor padded = Tensor::empty({1, 2048, 2, 8}, DType::kF32);
  std::fill_n(padded.data_as<float>(), padded.numel(), 0.0f);
  std::copy_n(c.k.data_as<float>(), c.k.numel(), padded.data_as<float>());
  const std::vector<float> got = xattention_block_mass(ExecContext{}, c.q.view(), c.k.view(), c.options);
  const std::vector<double> want = mass_by_definition(c.q, padded, 8, 32, 16);
  const int64_t kvbs = 6, padded_kvbs = 128;
  ASSERT_EQ(got.size(), want.size() / padded_kvbs * kvbs);
  for (size_t row = 0; row < got.size() / kvbs; ++row)
    for (int64_t c = 0; c < kvbs; ++c) EXPECT_NEAR(got[row * kvbs + c], want[row * padded_kvbs + c], 1e-4) << row;
}

TEST(XAttentionEstimator, FindsPlantedBlocksAndKeepsDiagonalAndFirst) {
  const Planted p = planted(12, 2, 32);
  XAttentionOptions o;
  o.block_q = 16;
  o.block_kv = 16;
  o.threshold = 0.6;
  const EstimateResult r = estimate_xattention_mask(ExecContext{}, p.q.view(), p.k.view(), o);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t row = 0; row < 12; ++row) {
      EXPECT_TRUE(keeps(r.mask, h, row, p.target[row])) << "planted, row " << row;
      EXPECT_TRUE(keeps(r.mask, h, row, static_cast<int32_t>(row))) << "diagonal, row " << row;
      EXPECT_TRUE(keeps(r.mask, h, row, 0)) << "first, row " << row;
    }
  EXPECT_LT(r.mask.density(), 0.5);
}

TEST(XAttentionEstimator, DensityGrowsWithThresholdAndMasksNest) {
  Tensor q = Tensor::empty({1, 512, 2, 32}, DType::kF32), k = Tensor::empty({1, 512, 2, 32}, DType::kF32);
  fill_normal(q.view(), 7);
  fill_normal(k.view(), 8);
  XAttentionOptions o;
  o.block_q = 64;
  o.block_kv = 32;
  o.stride = 16;
  std::vector<uint8_t> previous;
  double last_density = 0.0;
  for (double tau : {0.3, 0.5, 0.7, 0.9, 0.95, 0.99, 1.0}) {
    o.threshold = tau;
    const BlockMask m = estimate_xattention_mask(ExecContext{}, q.view(), k.view(), o).mask;
    EXPECT_GE(m.density(), last_density) << "tau " << tau;
    const std::vector<uint8_t> dense = m.to_dense();
    if (!previous.empty())
      for (size_t i = 0; i < dense.size(); ++i) EXPECT_GE(dense[i], previous[i]) << "tau " << tau << " entry " << i;
    previous = dense;
    last_density = m.density();
  }
}

TEST(XAttentionEstimator, PerHeadThresholds) {
  Tensor q = Tensor::empty({1, 256, 2, 16}, DType::kF32);
  fill_normal(q.view(), 9);
  XAttentionOptions o;
  o.block_q = 32;
  o.block_kv = 32;
  o.threshold = 0.5;
  const BlockMask low = estimate_xattention_mask(ExecContext{}, q.view(), q.view(), o).mask;
  o.per_head_threshold = {0.5, 1.0};
  const BlockMask mixed = estimate_xattention_mask(ExecContext{}, q.view(), q.view(), o).mask;
  for (int64_t r = 0; r < 8; ++r) {
    EXPECT_EQ(mixed.row(0, 0, r), low.row(0, 0, r));
    EXPECT_EQ(mixed.row(0, 1, r).size(), 8u) << "tau 1 keeps every block";
  }
  o.per_head_threshold = {0.5};
  expect_error([&] { estimate_xattention_mask(ExecContext{}, q.view(), q.view(), o); }, "per_head_threshold");
}

TEST(XAttentionEstimator, GqaAnyAndVotes) {
  const Planted p = planted(8, 4, 32);
  Tensor k2 = Tensor::empty({1, 128, 2, 32}, DType::kF32);  // 2 kv heads: take kv heads 0 and 2
  for (int64_t t = 0; t < 128; ++t)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t d = 0; d < 32; ++d)
        k2.data_as<float>()[(t * 2 + h) * 32 + d] = p.k.data_as<float>()[(t * 4 + 2 * h) * 32 + d];
  XAttentionOptions o;
  o.block_q = 16;
  o.block_kv = 16;
  o.threshold = 0.8;
  const BlockMask per_head = estimate_xattention_mask(ExecContext{}, p.q.view(), k2.view(), o).mask;
  o.gqa_any = true;
  const BlockMask any = estimate_xattention_mask(ExecContext{}, p.q.view(), k2.view(), o).mask;
  ASSERT_EQ(any.shape().mask_heads, 2);
  const std::vector<uint8_t> d_head = per_head.to_dense(), d_any = any.to_dense();
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t i = 0; i < 64; ++i)
      if (d_head[h * 64 + i]) EXPECT_TRUE(d_any[(h / 2) * 64 + i]);
  o.vote = XAttentionVote::kHeads;
  const BlockMask voted = estimate_xattention_mask(ExecContext{}, p.q.view(), k2.view(), o).mask;
  EXPECT_EQ(voted.shape().mask_heads, 1);
  // Head vote over the 2 kv heads: a cell needs both (more than half), plus the diagonal and block 0.
  const std::vector<uint8_t> d_voted = voted.to_dense();
  for (int64_t i = 0; i < 64; ++i)
    EXPECT_EQ(d_voted[i] != 0, (d_any[i] && d_any[64 + i]) || i % 8 == 0 || i % 8 == i / 8) << i;
  o.vote = XAttentionVote::kColumns;
  const BlockMask columns = estimate_xattention_mask(ExecContext{}, p.q.view(), k2.view(), o).mask;
  EXPECT_EQ(columns.shape().mask_heads, 1);
  for (int64_t row = 0; row < 8; ++row) {
    EXPECT_TRUE(keeps(columns, 0, row, 0));
    EXPECT_TRUE(keeps(columns, 0, row, 7));
    EXPECT_TRUE(keeps(columns, 0, row, static_cast<int32_t>(row)));
  }
}

TEST(XAttentionEstimator, RejectsBadOptions) {
  Tensor q = Tensor::empty({1, 64, 1, 16}, DType::kF32);
  XAttentionOptions o;
  o.stride = 4;
  expect_error([&] { estimate_xattention_mask(ExecContext{}, q.view(), q.view(), o); }, "stride");
  o.stride = 16;
  o.block_kv = 24;
  expect_error([&] { estimate_xattention_mask(ExecContext{}, q.view(), q.view(), o); }, "block_kv");
  o.block_kv = 64;
  o.threshold = 1.5;
  expect_error([&] { estimate_xattention_mask(ExecContext{}, q.view(), q.view(), o); }, "threshold");
}

}  // namespace
}  // namespace tessel
