// Sub-block masks on the CPU block-sparse kernel against the fp64 oracle: random token-level bits
// inside random kept blocks, partial blocks, odd lengths and block sizes, GQA, per-head masks,
// causal and window limits on top, and query rows whose bits are all clear (output 0, lse -inf).
#include <gtest/gtest.h>

#include "kernels/attention_test_util.h"
#include "kernels/sub_block_test_util.h"

namespace tessel {
namespace {

using testing::poisoned;
using testing::random_qkv;
using testing::SubBlockCase;

void check_sub_block(const SubBlockCase& c, DType dtype, const AttentionOptions& opt, uint64_t seed) {
  SCOPED_TRACE(detail::concat("B=", c.batch, " Sq=", c.seq_q, " Skv=", c.seq_kv, " H=", c.heads, "/", c.kv_heads,
                              " D=", c.dim, " ", dtype_name(dtype), " mask ", c.mask_batch, "x", c.mask_heads,
                              " blocks ", c.block_q, "x", c.block_kv, opt.causal ? " causal" : "",
                              " wl=", opt.window_left, " seed=", seed));
  const auto t = random_qkv(c.batch, c.seq_q, c.seq_kv, c.heads, c.kv_heads, c.dim, dtype, seed);
  const BlockMask mask = BlockMask::random({c.mask_batch, c.mask_heads, c.seq_q, c.seq_kv, c.block_q, c.block_kv},
                                           c.density, seed);
  const std::vector<uint32_t> bits = testing::random_sub_block_bits(mask, c.bit_density, seed);
  BlockMaskView mv = mask.view();
  mv.sub_block_bits = bits.data();
  Tensor out = poisoned(t.q.shape(), dtype);
  Tensor lse = poisoned({c.batch, c.heads, c.seq_q}, DType::kF32);
  block_sparse_attention_forward(ExecContext{}, t.q, t.k, t.v, mv, out, lse, opt);
  const auto exact = reference::block_sparse_attention(t.q, t.k, t.v, mv, opt);
  auto keep = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    return reference::block_mask_keeps(mv, b, h, c.heads, c.kv_heads, i, j);
  };
  testing::expect_close_to_reference(t, opt, keep, out, lse, exact);
  // Rows whose bits are all clear: exactly zero output and -inf lse.
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 3; i < c.seq_q; i += 7) {
        EXPECT_EQ(element_as_double(lse, (b * c.heads + h) * c.seq_q + i), -std::numeric_limits<double>::infinity());
        for (int64_t d = 0; d < c.dim; ++d)
          ASSERT_EQ(element_as_double(out, ((b * c.seq_q + i) * c.heads + h) * c.dim + d), 0.0) << "row " << i;
      }
}

TEST(SubBlockMask, MatchesReference) {
  uint64_t seed = 900;
  for (const SubBlockCase& c : testing::sub_block_cases_cpu())
    for (DType dtype : {DType::kF32, DType::kBF16}) check_sub_block(c, dtype, AttentionOptions{}, seed++);
}

TEST(SubBlockMask, CombinesWithCausalAndWindow) {
  AttentionOptions causal;
  causal.causal = true;
  AttentionOptions window;
  window.window_left = 37;
  window.window_right = 11;
  uint64_t seed = 950;
  for (const SubBlockCase& c : testing::sub_block_cases_cpu()) {
    check_sub_block(c, DType::kF16, causal, seed++);
    check_sub_block(c, DType::kF32, window, seed++);
  }
}

TEST(SubBlockMask, AllBitsSetEqualsWholeBlocks) {
  const auto t = random_qkv(1, 203, 190, 4, 2, 64, DType::kF32, 41);
  const BlockMask mask = BlockMask::random({1, 4, 203, 190, 64, 48}, 0.5, 41);
  const std::vector<uint32_t> bits(static_cast<size_t>(mask.nnz() * 64 * 2), ~0u);
  BlockMaskView with_bits = mask.view();
  with_bits.sub_block_bits = bits.data();
  Tensor a = poisoned(t.q.shape(), DType::kF32), b = poisoned(t.q.shape(), DType::kF32);
  Tensor lse_a = poisoned({1, 4, 203}, DType::kF32), lse_b = poisoned({1, 4, 203}, DType::kF32);
  block_sparse_attention_forward(ExecContext{}, t.q, t.k, t.v, mask.view(), a, lse_a);
  block_sparse_attention_forward(ExecContext{}, t.q, t.k, t.v, with_bits, b, lse_b);
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data_as<float>()[i], b.data_as<float>()[i]) << i;
  for (int64_t i = 0; i < lse_a.numel(); ++i) ASSERT_EQ(lse_a.data_as<float>()[i], lse_b.data_as<float>()[i]) << i;
}

}  // namespace
}  // namespace tessel
