// Block-sparse CPU attention against the fp64 oracle: per-batch / per-head masks, partial last
// blocks, empty rows, GQA, all dtypes, combined with causal and window limits.
#include <gtest/gtest.h>

#include "kernels/attention_test_util.h"
#include "tessel/sparse/block_mask.h"

namespace tessel {
namespace {

using testing::poisoned;
using testing::random_qkv;

struct SparseCase {
  int64_t batch, seq_q, seq_kv, heads, kv_heads, dim;
  DType dtype;
  int64_t mask_batch, mask_heads, block_q, block_kv;
  double density;
  bool causal = false;
  int64_t window_left = -1;
  bool empty_rows = false;  // clear every third mask row
};

BlockMask make_mask(const SparseCase& c, uint64_t seed) {
  BlockMaskShape shape{c.mask_batch, c.mask_heads, c.seq_q, c.seq_kv, c.block_q, c.block_kv};
  BlockMask mask = BlockMask::random(shape, c.density, seed);
  if (!c.empty_rows) return mask;
  std::vector<std::vector<int32_t>> rows;
  for (int64_t r = 0; r < shape.num_rows(); ++r) {
    const int64_t qb = shape.q_blocks();
    rows.push_back(r % 3 == 1 ? std::vector<int32_t>{} : mask.row(r / (qb * c.mask_heads), (r / qb) % c.mask_heads, r % qb));
  }
  return BlockMask::from_rows(shape, rows);
}

void check_sparse(const SparseCase& c, uint64_t seed) {
  SCOPED_TRACE(detail::concat("B=", c.batch, " Sq=", c.seq_q, " Skv=", c.seq_kv, " H=", c.heads, "/", c.kv_heads,
                              " D=", c.dim, " ", dtype_name(c.dtype), " mask ", c.mask_batch, "x", c.mask_heads,
                              " blocks ", c.block_q, "x", c.block_kv, " density ", c.density, c.causal ? " causal" : "",
                              " wl=", c.window_left, c.empty_rows ? " empty rows" : "", " seed=", seed));
  const auto t = random_qkv(c.batch, c.seq_q, c.seq_kv, c.heads, c.kv_heads, c.dim, c.dtype, seed);
  const BlockMask mask = make_mask(c, seed);
  const BlockMaskView mv = mask.view();
  AttentionOptions opt;
  opt.causal = c.causal;
  opt.window_left = c.window_left;
  Tensor out = poisoned(t.q.shape(), c.dtype);
  Tensor lse = poisoned({c.batch, c.heads, c.seq_q}, DType::kF32);
  block_sparse_attention_forward(ExecContext{}, t.q, t.k, t.v, mv, out, lse, opt);
  const auto exact = reference::block_sparse_attention(t.q, t.k, t.v, mv, opt);
  auto keep = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    const auto row = mask.row(c.mask_batch == 1 ? 0 : b, mv.mask_head_for(h, c.heads, c.kv_heads), i / c.block_q);
    return std::find(row.begin(), row.end(), static_cast<int32_t>(j / c.block_kv)) != row.end();
  };
  testing::expect_close_to_reference(t, opt, keep, out, lse, exact);
}

TEST(BlockSparseAttention, MatchesReference) {
  const std::vector<SparseCase> cases = {
      {1, 256, 256, 2, 2, 64, DType::kF32, 1, 1, 64, 32, 0.5},
      {2, 200, 170, 4, 2, 64, DType::kF32, 2, 4, 64, 32, 0.4},      // per-batch, per-q-head, partial blocks
      {2, 150, 300, 8, 1, 128, DType::kBF16, 1, 1, 32, 64, 0.3},    // GQA 8, shared mask
      {1, 190, 190, 4, 2, 96, DType::kF16, 1, 2, 48, 40, 0.5},      // per-kv-head mask
      {1, 130, 260, 4, 2, 80, DType::kBF16, 1, 4, 128, 64, 0.25},   // block_q > tile rows
      {1, 100, 100, 2, 1, 64, DType::kF32, 1, 2, 16, 16, 0.3, false, -1, true},  // empty rows
      {2, 160, 160, 4, 4, 64, DType::kBF16, 2, 1, 64, 64, 0.6, true},            // causal inside blocks
      {1, 170, 120, 2, 2, 64, DType::kF32, 1, 2, 32, 32, 0.7, true, 20},         // S_q > S_kv, window
      {1, 64, 300, 2, 2, 64, DType::kF16, 1, 1, 64, 64, 1.0},                    // full mask
  };
  uint64_t seed = 200;
  for (const auto& c : cases) check_sparse(c, seed++);
}

TEST(BlockSparseAttention, FullMaskEqualsDense) {
  const auto t = random_qkv(1, 150, 170, 4, 2, 64, DType::kF32, 33);
  const BlockMask mask = BlockMask::full({1, 1, 150, 170, 64, 64});
  Tensor a = poisoned(t.q.shape(), DType::kF32), b = poisoned(t.q.shape(), DType::kF32);
  attention_forward(ExecContext{}, t.q, t.k, t.v, a, TensorView{});
  block_sparse_attention_forward(ExecContext{}, t.q, t.k, t.v, mask.view(), b, TensorView{});
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_NEAR(a.data_as<float>()[i], b.data_as<float>()[i], 1e-6) << i;
}

}  // namespace
}  // namespace tessel
