// The fp64 oracle itself, on cases small enough to work out by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "tessel/kernels/reference.h"

namespace tessel {
namespace {

TEST(ReferenceAttention, HandComputedTwoKeys) {
  // One query (1, 0), keys (1, 0) and (0, 1), values 10 and 20 in dim 0, scale 1:
  // scores 1 and 0 -> p = e/(e+1), 1/(e+1); out = 10 p0 + 20 p1; lse = ln(e + 1).
  std::vector<float> q{1, 0}, k{1, 0, 0, 1}, v{10, 0, 20, 0};
  const TensorView qv(q.data(), DType::kF32, Device::cpu(), {1, 1, 1, 2});
  const TensorView kv(k.data(), DType::kF32, Device::cpu(), {1, 2, 1, 2});
  const TensorView vv(v.data(), DType::kF32, Device::cpu(), {1, 2, 1, 2});
  AttentionOptions opt;
  opt.scale = 1.0f;
  const auto r = reference::attention(qv, kv, vv, opt);
  const double e = std::exp(1.0);
  EXPECT_NEAR(r.out_at(0, 0, 0, 0), (10 * e + 20) / (e + 1), 1e-12);
  EXPECT_NEAR(r.out_at(0, 0, 0, 1), 0.0, 1e-12);
  EXPECT_NEAR(r.lse_at(0, 0, 0), std::log(e + 1), 1e-12);
}

TEST(ReferenceAttention, VisibilityRules) {
  AttentionOptions causal;
  causal.causal = true;
  // S_q = 2, S_kv = 4: bottom-right alignment puts query 0 on key 2.
  EXPECT_TRUE(reference::key_visible(0, 2, 2, 4, causal));
  EXPECT_FALSE(reference::key_visible(0, 3, 2, 4, causal));
  EXPECT_TRUE(reference::key_visible(1, 3, 2, 4, causal));
  // S_q = 4, S_kv = 2: query 0 and 1 see nothing.
  EXPECT_FALSE(reference::key_visible(1, 0, 4, 2, causal));
  EXPECT_TRUE(reference::key_visible(2, 0, 4, 2, causal));
  AttentionOptions window;
  window.window_left = 1;
  window.window_right = 2;
  EXPECT_FALSE(reference::key_visible(5, 3, 10, 10, window));
  EXPECT_TRUE(reference::key_visible(5, 4, 10, 10, window));
  EXPECT_TRUE(reference::key_visible(5, 7, 10, 10, window));
  EXPECT_FALSE(reference::key_visible(5, 8, 10, 10, window));
}

TEST(ReferenceAttention, RowSubsetMatchesFullRun) {
  std::vector<float> q(3 * 4 * 2 * 8), k(5 * 1 * 8), v(5 * 1 * 8);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.3 * i);
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.7 * i), v[i] = std::sin(1.1 * i);
  const TensorView qv(q.data(), DType::kF32, Device::cpu(), {3, 4, 2, 8});
  // GQA: both query heads read the single kv head; batch 3 with k broadcast is not allowed, so use B=3 copies.
  std::vector<float> k3, v3;
  for (int b = 0; b < 3; ++b) k3.insert(k3.end(), k.begin(), k.end()), v3.insert(v3.end(), v.begin(), v.end());
  const TensorView kv(k3.data(), DType::kF32, Device::cpu(), {3, 5, 1, 8});
  const TensorView vv(v3.data(), DType::kF32, Device::cpu(), {3, 5, 1, 8});
  const auto all = reference::attention(qv, kv, vv);
  const auto some = reference::attention(qv, kv, vv, {}, {3, 1});
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t h = 0; h < 2; ++h) {
      EXPECT_DOUBLE_EQ(some.lse_at(b, h, 0), all.lse_at(b, h, 3));
      EXPECT_DOUBLE_EQ(some.lse_at(b, h, 1), all.lse_at(b, h, 1));
      for (int64_t d = 0; d < 8; ++d) EXPECT_DOUBLE_EQ(some.out_at(b, 1, h, d), all.out_at(b, 1, h, d));
    }
}

}  // namespace
}  // namespace tessel
