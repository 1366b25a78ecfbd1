// merge_attention_states: attention over [K1; K2] equals the merge of attention over K1 and K2.
#include <gtest/gtest.h>

#include "kernels/attention_test_util.h"

namespace tessel {
namespace {

using testing::poisoned;

TensorView rows(const Tensor& t, int64_t begin, int64_t end) {
  const size_t offset = static_cast<size_t>(begin * t.view().stride(1)) * dtype_size(t.dtype());
  return TensorView(static_cast<char*>(t.data()) + offset, t.dtype(), Device::cpu(),
                    {t.size(0), end - begin, t.size(2), t.size(3)}, t.view().strides());
}

void check_merge_identity(DType dtype, int64_t split, bool causal, bool in_place, uint64_t seed) {
  SCOPED_TRACE(detail::concat(dtype_name(dtype), " split=", split, causal ? " causal" : "", in_place ? " in place" : ""));
  const int64_t b = 2, sq = 90, skv = 150, h = 4, hk = 2, d = 64;
  const auto t = testing::random_qkv(b, sq, skv, h, hk, d, dtype, seed);
  AttentionOptions opt;
  opt.causal = causal;
  Tensor out_a = poisoned(t.q.shape(), dtype), out_b = poisoned(t.q.shape(), dtype);
  Tensor lse_a = poisoned({b, h, sq}, DType::kF32), lse_b = poisoned({b, h, sq}, DType::kF32);
  // Causal (split <= S_kv - S_q): every query sees all keys of part A, and causal attention over
  // part B alone has the same bottom-right alignment as over the whole.
  attention_forward(ExecContext{}, t.q, rows(t.k, 0, split), rows(t.v, 0, split), out_a, lse_a, causal ? AttentionOptions{} : opt);
  attention_forward(ExecContext{}, t.q, rows(t.k, split, skv), rows(t.v, split, skv), out_b, lse_b, opt);
  Tensor out = in_place ? out_a : poisoned(t.q.shape(), dtype);
  Tensor lse = in_place ? lse_a : poisoned({b, h, sq}, DType::kF32);
  merge_attention_states(ExecContext{}, out_a, lse_a, out_b, lse_b, out, lse);
  const auto exact = reference::attention(t.q, t.k, t.v, opt);
  const auto got = testing::compare(out, lse, exact);
  EXPECT_TRUE(got.finite);
  EXPECT_TRUE(got.lse_pattern_ok);
  EXPECT_LE(got.out, dtype == DType::kF32 ? 5e-6 : 2e-2);
  EXPECT_LE(got.lse, dtype == DType::kF32 ? 2e-5 : 2e-3);
}

TEST(MergeAttentionStates, SplitKeysEqualsWhole) {
  check_merge_identity(DType::kF32, 70, false, false, 1);
  check_merge_identity(DType::kBF16, 64, false, true, 2);
  check_merge_identity(DType::kF16, 1, false, false, 3);
  // Causal with S_q < S_kv: the first part (keys before S_kv - S_q) is visible to every query,
  // so unrestricted attention over it plus causal attention over the rest is the causal whole.
  check_merge_identity(DType::kF32, 60, true, false, 4);
}

TEST(MergeAttentionStates, EmptySidesAreHandled) {
  const int64_t b = 1, s = 3, h = 1, d = 16;
  Tensor a = Tensor::empty({b, s, h, d}, DType::kF32), c = Tensor::empty({b, s, h, d}, DType::kF32);
  fill(a.view(), 2.0);
  fill(c.view(), std::numeric_limits<double>::quiet_NaN());  // never read: its weight is zero
  Tensor la = Tensor::empty({b, h, s}, DType::kF32), lc = Tensor::empty({b, h, s}, DType::kF32);
  fill(la.view(), 0.5);
  fill(lc.view(), -INFINITY);
  la.data_as<float>()[2] = -INFINITY;  // row 2: both empty
  Tensor out = poisoned({b, s, h, d}, DType::kF32), lse = poisoned({b, h, s}, DType::kF32);
  merge_attention_states(ExecContext{}, a, la, c, lc, out, lse);
  for (int64_t i = 0; i < 2; ++i) {
    EXPECT_FLOAT_EQ(lse.data_as<float>()[i], 0.5f);
    for (int64_t k = 0; k < d; ++k) EXPECT_FLOAT_EQ(out.data_as<float>()[i * d + k], 2.0f);
  }
  EXPECT_EQ(lse.data_as<float>()[2], -INFINITY);
  for (int64_t k = 0; k < d; ++k) EXPECT_EQ(out.data_as<float>()[2 * d + k], 0.0f);
}

}  // namespace
}  // namespace tessel
