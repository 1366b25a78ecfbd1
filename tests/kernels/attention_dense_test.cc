// Dense CPU attention against the fp64 oracle over many shapes, dtypes, GQA ratios, causal and
// window settings. Tolerance: 2x the error of the plain same-dtype reference plus a few ulps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/attention_test_util.h"
#include "tessel/core/parallel.h"

namespace tessel {
namespace {

using testing::poisoned;
using testing::random_qkv;

struct DenseCase {
  int64_t batch, seq_q, seq_kv, heads, kv_heads, dim;
  DType dtype;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  float scale = 0.0f;
};

std::string describe(const DenseCase& c) {
  return detail::concat("B=", c.batch, " Sq=", c.seq_q, " Skv=", c.seq_kv, " H=", c.heads, "/", c.kv_heads, " D=", c.dim,
                        " ", dtype_name(c.dtype), c.causal ? " causal" : "", " window=(", c.window_left, ",",
                        c.window_right, ") scale=", c.scale);
}

void check_dense(const DenseCase& c, uint64_t seed) {
  SCOPED_TRACE(describe(c) + detail::concat(" seed=", seed));
  const auto t = random_qkv(c.batch, c.seq_q, c.seq_kv, c.heads, c.kv_heads, c.dim, c.dtype, seed);
  AttentionOptions opt;
  opt.causal = c.causal;
  opt.window_left = c.window_left;
  opt.window_right = c.window_right;
  opt.scale = c.scale;
  Tensor out = poisoned(t.q.shape(), c.dtype);
  Tensor lse = poisoned({c.batch, c.heads, c.seq_q}, DType::kF32);
  attention_forward(ExecContext{}, t.q, t.k, t.v, out, lse, opt);
  const auto exact = reference::attention(t.q, t.k, t.v, opt);
  testing::expect_close_to_reference(t, opt, [](int64_t, int64_t, int64_t, int64_t) { return true; }, out, lse, exact);
}

TEST(DenseAttention, MatchesReferenceAcrossShapesAndDtypes) {
  const std::vector<DenseCase> cases = {
      {1, 64, 64, 1, 1, 64, DType::kF32},
      {2, 77, 131, 4, 4, 64, DType::kF32},
      {1, 130, 65, 2, 1, 128, DType::kF32},
      {1, 100, 100, 8, 1, 80, DType::kF32},
      {2, 33, 200, 4, 2, 96, DType::kBF16},
      {1, 129, 129, 2, 2, 128, DType::kBF16},
      {1, 70, 150, 8, 1, 64, DType::kF16},
      {1, 50, 90, 2, 2, 80, DType::kF16},
      {1, 1, 257, 2, 1, 64, DType::kF32},
      {1, 200, 1, 2, 2, 64, DType::kBF16},
      {1, 40, 40, 2, 2, 64, DType::kF32, false, -1, -1, 0.3f},
      {1, 45, 61, 4, 4, 40, DType::kBF16},  // head_dim padded to 48 inside the kernel
      {1, 37, 70, 2, 2, 256, DType::kF32},
      {1, 140, 90, 16, 2, 64, DType::kF32},   // GQA 8 with many rows per item
  };
  uint64_t seed = 1;
  for (const auto& c : cases) check_dense(c, seed++);
}

TEST(DenseAttention, CausalAndWindowIncludingEmptyRows) {
  const std::vector<DenseCase> cases = {
      {1, 150, 150, 2, 2, 64, DType::kF32, true},
      {2, 65, 190, 4, 2, 64, DType::kBF16, true},        // S_q < S_kv: bottom-right aligned
      {1, 190, 65, 2, 1, 128, DType::kF32, true},        // S_q > S_kv: first rows see no key
      {1, 140, 140, 8, 1, 96, DType::kF16, true, 31, -1},
      {1, 120, 160, 2, 2, 64, DType::kF32, false, 17, 9},
      {1, 120, 100, 2, 2, 80, DType::kBF16, false, 5, 0},
      {1, 100, 100, 2, 1, 64, DType::kF32, false, -1, 3},
      {1, 90, 300, 2, 2, 64, DType::kF32, false, 10, -1},  // many whole tiles skipped on the left
  };
  uint64_t seed = 100;
  for (const auto& c : cases) check_dense(c, seed++);
}

TEST(DenseAttention, EmptyKeysGiveZeroAndMinusInfinity) {
  const auto t = random_qkv(1, 5, 0, 2, 2, 64, DType::kF32, 7);
  Tensor out = poisoned(t.q.shape(), DType::kF32), lse = poisoned({1, 2, 5}, DType::kF32);
  attention_forward(ExecContext{}, t.q, t.k, t.v, out, lse);
  for (int64_t i = 0; i < out.numel(); ++i) EXPECT_EQ(out.data_as<float>()[i], 0.0f);
  for (int64_t i = 0; i < lse.numel(); ++i) EXPECT_EQ(lse.data_as<float>()[i], -INFINITY);
}

TEST(DenseAttention, StridedInputsAndNoLse) {
  // q, k, v as slices of one packed (B, S, 3, H, D) buffer: batch/sequence/head strides are free.
  const int64_t b = 1, s = 70, h = 2, d = 64;
  Tensor packed = Tensor::empty({b, s, 3 * h, d}, DType::kF32);
  fill_normal(packed.view(), 5);
  const Shape strides{s * 3 * h * d, 3 * h * d, d, 1};
  auto slice = [&](int64_t part) {
    return TensorView(packed.data_as<float>() + part * h * d, DType::kF32, Device::cpu(), {b, s, h, d}, strides);
  };
  Tensor out = poisoned({b, s, h, d}, DType::kF32);
  attention_forward(ExecContext{}, slice(0), slice(1), slice(2), out, TensorView{});
  const auto exact = reference::attention(slice(0), slice(1), slice(2));
  const auto got = testing::compare(out, TensorView{}, exact);
  EXPECT_TRUE(got.finite);
  EXPECT_LE(got.out, 2e-6);
}

TEST(DenseAttention, SameBitsForAnyThreadCount) {
  // Each query tile is computed by one thread in a fixed order, so threads change nothing.
  const auto t = random_qkv(2, 300, 260, 4, 2, 64, DType::kBF16, 77);
  AttentionOptions opt;
  opt.causal = true;
  Tensor one = poisoned(t.q.shape(), DType::kBF16), two = poisoned(t.q.shape(), DType::kBF16);
  set_num_threads(1);
  attention_forward(ExecContext{}, t.q, t.k, t.v, one, TensorView{}, opt);
  set_num_threads(2);
  attention_forward(ExecContext{}, t.q, t.k, t.v, two, TensorView{}, opt);
  set_num_threads(0);
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.nbytes()), 0);
}

}  // namespace
}  // namespace tessel

namespace tessel {
namespace {

// NaN propagates as in FlashAttention and the CUDA kernels: a NaN in q makes that query row's
// output and LSE NaN (it used to come out a zero row); a NaN in k makes every row of the heads
// reading that kv head NaN; the other rows stay finite. Dense and block-sparse, fp32 and bf16,
// several lengths (tiles of every size and a partial one).
TEST(DenseAttention, NaNInQOrKPropagatesToTheRowsThatReadIt) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const DType dtype : {DType::kF32, DType::kBF16})
    for (const int64_t seq : {7, 130, 300}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " seq " << seq);
      const int64_t heads = 4, kv_heads = 2, dim = 64;
      auto t = random_qkv(1, seq, seq, heads, kv_heads, dim, DType::kF32, 41);
      const int64_t bad_row = seq / 2, bad_head = 1;
      t.q.data_as<float>()[(bad_row * heads + bad_head) * dim + 3] = nan;
      const auto run = [&](const Tensor& q, const Tensor& k, bool sparse) {
        const Tensor qd = q.to(dtype), kd = k.to(dtype), vd = t.v.to(dtype);
        Tensor out = poisoned(q.shape(), dtype), lse = poisoned({1, heads, seq}, DType::kF32);
        if (sparse) {  // every block kept, through the block-sparse path
          const int64_t blocks = (seq + 63) / 64;
          std::vector<int32_t> indptr, indices;
          for (int64_t row = 0; row <= blocks; ++row) indptr.push_back(static_cast<int32_t>(row * blocks));
          for (int64_t row = 0; row < blocks; ++row)
            for (int64_t col = 0; col < blocks; ++col) indices.push_back(static_cast<int32_t>(col));
          BlockMaskView mask;
          mask.indptr = indptr.data();
          mask.indices = indices.data();
          mask.q_blocks = mask.kv_blocks = blocks;
          mask.block_q = mask.block_kv = 64;
          mask.seq_q = mask.seq_kv = seq;
          block_sparse_attention_forward(ExecContext{}, qd, kd, vd, mask, out, lse);
        } else {
          attention_forward(ExecContext{}, qd, kd, vd, out, lse);
        }
        return std::pair{out.to(DType::kF32), lse};
      };
      for (const bool sparse : {false, true}) {
        const auto [out, lse] = run(t.q, t.k, sparse);
        for (int64_t i = 0; i < seq; ++i)
          for (int64_t h = 0; h < heads; ++h) {
            const bool bad = i == bad_row && h == bad_head;
            const double value = element_as_double(out, (i * heads + h) * dim);
            EXPECT_EQ(std::isnan(value), bad) << "row " << i << " head " << h << (sparse ? " sparse" : " dense");
            EXPECT_EQ(std::isnan(element_as_double(lse, h * seq + i)), bad) << "lse row " << i << " head " << h;
          }
      }
      // A NaN in k (kv head 0): every query row of heads 0 and 1 (GQA) comes out NaN.
      Tensor k = t.k.to(DType::kF32);
      t.q.data_as<float>()[(bad_row * heads + bad_head) * dim + 3] = 0.5f;
      k.data_as<float>()[((seq - 1) * kv_heads + 0) * dim + 5] = nan;
      const auto [out, lse] = run(t.q, k, false);
      for (int64_t i = 0; i < seq; ++i)
        for (int64_t h = 0; h < heads; ++h)
          EXPECT_EQ(std::isnan(element_as_double(out, (i * heads + h) * dim)), h < 2) << "row " << i << " head " << h;
    }
}

}  // namespace
}  // namespace tessel
