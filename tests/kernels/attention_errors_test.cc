// Bad arguments raise tessel::Error naming the argument, and nothing is written.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "kernels/attention_test_util.h"
#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"
#include "tessel/sparse/block_mask.h"

namespace tessel {
namespace {

using testing::poisoned;

// Runs f, expects an Error whose message contains `needle`, and checks `out` is still all NaN.
template <typename F>
void expect_error(F&& f, const std::string& needle, const Tensor& out) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
  for (int64_t i = 0; i < out.numel(); ++i)
    ASSERT_TRUE(std::isnan(element_as_double(out.view(), i))) << "output written at " << i;
}

struct Fixture {
  testing::Qkv t = testing::random_qkv(1, 16, 24, 4, 2, 32, DType::kF32, 9);
  Tensor out = poisoned({1, 16, 4, 32}, DType::kF32);
  Tensor lse = poisoned({1, 4, 16}, DType::kF32);
};

// FP8 compute (AttentionPrecision::kFp8) runs on CUDA only: CPU calls say so and write nothing.
TEST(AttentionErrors, Fp8PrecisionIsCudaOnly) {
  Fixture f;
  AttentionOptions fp8;
  fp8.precision = AttentionPrecision::kFp8;
  expect_error([&] { attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, f.out, f.lse, fp8); }, "options.precision", f.out);
  BlockMaskShape shape;
  shape.seq_q = 16;
  shape.seq_kv = 24;
  shape.block_q = 16;
  shape.block_kv = 8;
  const BlockMask mask = BlockMask::full(shape);
  expect_error([&] { block_sparse_attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, mask.view(), f.out, f.lse, fp8); },
               "options.precision", f.out);
}

// Pre-quantized q and k (AttentionOptions::fp8_query_key_given) belong to FP8 calls only, and
// their workspace slices exist on CUDA only.
TEST(AttentionErrors, GivenFp8QueryKeyNeedsFp8OnCuda) {
  Fixture f;
  AttentionOptions given;
  given.fp8_query_key_given = true;
  expect_error([&] { attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, f.out, f.lse, given); }, "options.fp8_query_key_given", f.out);
  try {
    fp8_attention_query_key(ExecContext{}, Device::cpu(), AttentionDims{1, 64, 64, 1, 1, 128, AttentionPrecision::kFp8});
    ADD_FAILURE() << "fp8_attention_query_key accepted a CPU device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device"), std::string::npos) << e.what();
  }
}

TEST(AttentionErrors, NegativeSmMarginIsRefused) {
  Fixture f;
  AttentionOptions options;
  options.sm_margin = -1;
  expect_error([&] { attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, f.out, f.lse, options); }, "options.sm_margin", f.out);
  options.sm_margin = 7;  // a timing hint: CPU attention runs as without it
  Tensor plain = Tensor::empty(f.out.shape(), f.out.dtype()), hinted = Tensor::empty(f.out.shape(), f.out.dtype());
  attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, plain, TensorView{});
  attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, hinted, TensorView{}, options);
  EXPECT_EQ(std::memcmp(plain.data(), hinted.data(), plain.nbytes()), 0);
}

TEST(AttentionErrors, ShapesDtypesHeadsAndLse) {
  Fixture f;
  const Tensor k_bad_dim = Tensor::zeros({1, 24, 2, 16}, DType::kF32);
  expect_error([&] { attention_forward(ExecContext{}, f.t.q, k_bad_dim, f.t.v, f.out, f.lse); }, "k:", f.out);
  const Tensor v_bad = Tensor::zeros({1, 23, 2, 32}, DType::kF32);
  expect_error([&] { attention_forward(ExecContext{}, f.t.q, f.t.k, v_bad, f.out, f.lse); }, "v:", f.out);
  const Tensor k_bf16 = Tensor::zeros({1, 24, 2, 32}, DType::kBF16);
  expect_error([&] { attention_forward(ExecContext{}, f.t.q, k_bf16, f.t.v, f.out, f.lse); }, "dtype", f.out);
  const Tensor k3 = Tensor::zeros({1, 24, 3, 32}, DType::kF32), v3 = Tensor::zeros({1, 24, 3, 32}, DType::kF32);
  expect_error([&] { attention_forward(ExecContext{}, f.t.q, k3, v3, f.out, f.lse); }, "dividing", f.out);
  const Tensor k_batch = Tensor::zeros({2, 24, 2, 32}, DType::kF32), v_batch = Tensor::zeros({2, 24, 2, 32}, DType::kF32);
  expect_error([&] { attention_forward(ExecContext{}, f.t.q, k_batch, v_batch, f.out, f.lse); }, "batch", f.out);
  const Tensor lse_shape = Tensor::zeros({1, 16, 4}, DType::kF32);
  expect_error([&] { attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, f.out, lse_shape); }, "lse:", f.out);
  const Tensor lse_dtype = Tensor::zeros({1, 4, 16}, DType::kBF16);
  expect_error([&] { attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, f.out, lse_dtype); }, "lse: expected dtype fp32", f.out);
  const Tensor q_i32 = Tensor::zeros({1, 16, 4, 32}, DType::kI32);
  expect_error([&] { attention_forward(ExecContext{}, q_i32, f.t.k, f.t.v, f.out, f.lse); }, "q:", f.out);
  const Tensor q3 = Tensor::zeros({16, 4, 32}, DType::kF32);
  expect_error([&] { attention_forward(ExecContext{}, q3, f.t.k, f.t.v, f.out, f.lse); }, "rank 4", f.out);
  const Tensor out_small = Tensor::zeros({1, 15, 4, 32}, DType::kF32);
  expect_error([&] { attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, out_small, f.lse); }, "out:", f.out);
  const TensorView q_strided(f.t.q.data(), DType::kF32, Device::cpu(), {1, 8, 4, 16}, {2048, 128, 32, 2});
  expect_error([&] { attention_forward(ExecContext{}, q_strided, f.t.k, f.t.v, f.out, f.lse); }, "head_dim stride 1", f.out);
  AttentionOptions bad_window;
  bad_window.window_left = -3;
  expect_error([&] { attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, f.out, f.lse, bad_window); }, "window_left", f.out);
  AttentionOptions bad_scale;
  bad_scale.scale = NAN;
  expect_error([&] { attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, f.out, f.lse, bad_scale); }, "scale", f.out);
}

TEST(AttentionErrors, WrongDevice) {
  Fixture f;
  // A view that claims to be on a GPU: rejected before any memory is touched.
  const TensorView k_gpu(f.t.k.data(), DType::kF32, Device::cuda(0), f.t.k.shape());
  expect_error([&] { attention_forward(ExecContext{}, f.t.q, k_gpu, f.t.v, f.out, f.lse); }, "k: expected device cpu", f.out);
  if (!cuda_compiled()) {
    const TensorView q_gpu(f.t.q.data(), DType::kF32, Device::cuda(0), f.t.q.shape());
    const TensorView v_gpu(f.t.v.data(), DType::kF32, Device::cuda(0), f.t.v.shape());
    const TensorView o_gpu(f.out.data(), DType::kF32, Device::cuda(0), f.out.shape());
    expect_error([&] { attention_forward(ExecContext{}, q_gpu, k_gpu, v_gpu, o_gpu, TensorView{}); }, "without CUDA", f.out);
  }
}

TEST(AttentionErrors, MaskMustMatchTensors) {
  Fixture f;
  const BlockMask good = BlockMask::full({1, 2, 16, 24, 8, 8});
  BlockMaskView v = good.view();
  v.seq_kv = 32;
  v.kv_blocks = 4;
  expect_error([&] { block_sparse_attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, v, f.out, f.lse); }, "mask.seq_kv", f.out);
  v = good.view();
  v.mask_heads = 3;
  expect_error([&] { block_sparse_attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, v, f.out, f.lse); }, "mask.mask_heads", f.out);
  v = good.view();
  v.q_blocks = 3;
  expect_error([&] { block_sparse_attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, v, f.out, f.lse); }, "mask.q_blocks", f.out);
  const BlockMask other_batch = BlockMask::full({3, 1, 16, 24, 8, 8});
  expect_error([&] { block_sparse_attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, other_batch.view(), f.out, f.lse); },
               "mask.mask_batch", f.out);
  // A raw view with an out-of-range index is caught on the CPU, naming the row.
  std::vector<int32_t> indptr{0, 1, 2, 3, 4}, indices{0, 1, 7, 2};
  BlockMaskView raw = BlockMask::full({1, 2, 16, 24, 8, 8}).view();
  raw.indptr = indptr.data();
  raw.indices = indices.data();
  expect_error([&] { block_sparse_attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, raw, f.out, f.lse); },
               "mask row (batch 0, head 1, q_block 0): kv block index 7", f.out);
  BlockMaskView on_gpu = good.view();
  on_gpu.device = Device::cuda(0);
  expect_error([&] { block_sparse_attention_forward(ExecContext{}, f.t.q, f.t.k, f.t.v, on_gpu, f.out, f.lse); }, "mask.device", f.out);
}

TEST(AttentionErrors, MergeArguments) {
  Fixture f;
  const Tensor a = Tensor::zeros({1, 16, 4, 32}, DType::kF32), la = Tensor::zeros({1, 4, 16}, DType::kF32);
  const Tensor b_bad = Tensor::zeros({1, 16, 4, 16}, DType::kF32);
  expect_error([&] { merge_attention_states(ExecContext{}, a, la, b_bad, la, f.out, f.lse); }, "out_b", f.out);
  const Tensor lse_bad = Tensor::zeros({1, 16, 4}, DType::kF32);
  expect_error([&] { merge_attention_states(ExecContext{}, a, lse_bad, a, la, f.out, f.lse); }, "lse_a", f.out);
  expect_error([&] { merge_attention_states(ExecContext{}, a, la, a, la, f.out, TensorView{}); }, "lse", f.out);
}

TEST(AttentionScale, DefaultIsInverseSqrtHeadDim) {
  EXPECT_FLOAT_EQ(attention_scale({}, 64), 0.125f);
  AttentionOptions o;
  o.scale = 0.5f;
  EXPECT_FLOAT_EQ(attention_scale(o, 64), 0.5f);
  EXPECT_THROW(attention_scale({}, 0), Error);
}

}  // namespace
}  // namespace tessel
