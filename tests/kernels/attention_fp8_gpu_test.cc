// The FP8 (e4m3) mode of the CUDA attention kernels (AttentionPrecision::kFp8: per-64-token q and k
// scales, per-channel v scales, P in e4m3) against the fp64 oracle and against the same call in
// the inputs' precision, dense and block-sparse, on fresh random inputs with odd lengths, partial
// blocks, GQA, causal and window limits, empty rows and LSE. Each case prints its errors (the
// FP8-vs-bf16 report). Skips without a compute capability 9.0 GPU (the only one that runs it).
//
// Bounds: on standard-normal q, k, v at D = 128 an emulation of this quantization (numpy, e4m3
// rounding of the scaled blocks, of P x 448 and of the channel-scaled v) gives a relative L2
// output error of 0.049-0.055 and a max error of 0.06-0.10 of the largest output; the tests allow
// 0.08 and 0.2. A wrong scale, key order or fragment layout gives errors of order 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "attention_gpu_util.h"
#include "kernels/attention_test_util.h"
#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/reference.h"
#include "tessel/sparse/block_mask.h"

namespace tessel {
namespace {

using gpu_test::expect_error_naming;
using gpu_test::hopper_device;
using testing::Qkv;

constexpr int64_t kDim = 128;  // the FP8 mode's head dim
constexpr double kMaxRelativeL2 = 0.08;
constexpr double kMaxRelativeAbs = 0.2;
constexpr double kMaxLseError = 0.5;  // one-key rows carry the whole score's quantization error

#define SKIP_WITHOUT_HOPPER() \
  if (!hopper_device()) GTEST_SKIP() << "FP8 attention needs a compute capability 9.0 GPU (none visible)"

struct Case {
  int64_t batch, seq_q, seq_kv, heads, kv_heads;
  DType dtype;
  AttentionOptions options;
};

std::string describe(const Case& c) {
  return detail::concat("B=", c.batch, " Sq=", c.seq_q, " Skv=", c.seq_kv, " H=", c.heads, "/", c.kv_heads, " ",
                        dtype_name(c.dtype), " causal=", c.options.causal, " window=(", c.options.window_left, ",",
                        c.options.window_right, ")");
}

// Output errors of `out` against the oracle: ||out - ref|| / ||ref||, max |out - ref| / max |ref|,
// max LSE error over finite rows, whether -inf sits exactly where the oracle has it, no NaN.
struct Fp8Errors {
  double relative_l2 = 0.0, relative_abs = 0.0, lse = 0.0;
  bool lse_pattern_ok = true, finite = true;
};

Fp8Errors measure(const Tensor& out_host, const Tensor& lse_host, const reference::AttentionResult& ref) {
  Fp8Errors e;
  double diff2 = 0.0, ref2 = 0.0, max_diff = 0.0, max_ref = 0.0;
  const int64_t seq_q = out_host.size(1), heads = out_host.size(2);
  for (int64_t b = 0; b < ref.batch; ++b)
    for (int64_t r = 0; r < ref.rows(); ++r) {
      const int64_t i = ref.q_rows[static_cast<size_t>(r)];
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t d = 0; d < kDim; ++d) {
          const double got = element_as_double(out_host.view(), ((b * seq_q + i) * heads + h) * kDim + d);
          const double want = ref.out_at(b, r, h, d);
          if (!std::isfinite(got)) e.finite = false;
          diff2 += (got - want) * (got - want);
          ref2 += want * want;
          max_diff = std::max(max_diff, std::abs(got - want));
          max_ref = std::max(max_ref, std::abs(want));
        }
        const double got = element_as_double(lse_host.view(), (b * heads + h) * seq_q + i), want = ref.lse_at(b, h, r);
        if (std::isinf(want) || std::isinf(got))
          e.lse_pattern_ok = e.lse_pattern_ok && got == want;
        else
          e.lse = std::max(e.lse, std::abs(got - want));
      }
    }
  e.relative_l2 = ref2 > 0.0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  e.relative_abs = max_ref > 0.0 ? max_diff / max_ref : max_diff;
  return e;
}

// ||a - b|| / ||b|| of two device outputs of the same shape.
double relative_l2_between(const Tensor& a_host, const Tensor& b_host) {
  double diff2 = 0.0, ref2 = 0.0;
  for (int64_t n = 0; n < a_host.numel(); ++n) {
    const double a = element_as_double(a_host.view(), n), b = element_as_double(b_host.view(), n);
    diff2 += (a - b) * (a - b);
    ref2 += b * b;
  }
  return ref2 > 0.0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
}

// Runs `call` (which writes out and lse with the given options) once in FP8 and once in the
// inputs' precision, checks the FP8 result against the oracle and prints both errors.
void check_fp8_case(const Case& c, const Qkv& host, const reference::AttentionResult& ref, const std::string& label,
                    const std::function<void(const ExecContext&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                             const Tensor&, const AttentionOptions&)>& call) {
  SCOPED_TRACE(describe(c) + " " + label);
  const Device gpu = Device::cuda();
  const Tensor q = host.q.to(gpu), k = host.k.to(gpu), v = host.v.to(gpu);
  Workspace workspace(gpu);
  ExecContext ctx;
  ctx.device = gpu;
  AttentionDims dims{c.batch, c.seq_q, c.seq_kv, c.heads, c.kv_heads, kDim};
  dims.precision = AttentionPrecision::kFp8;
  workspace.reserve(attention_workspace_bytes(ctx, gpu, dims, 64));
  ctx.workspace = &workspace;

  AttentionOptions fp8_options = c.options;
  fp8_options.precision = AttentionPrecision::kFp8;
  Tensor out_fp8 = testing::poisoned({c.batch, c.seq_q, c.heads, kDim}, c.dtype).to(gpu);
  Tensor lse_fp8 = testing::poisoned({c.batch, c.heads, c.seq_q}, DType::kF32).to(gpu);
  Tensor out_plain = testing::poisoned({c.batch, c.seq_q, c.heads, kDim}, c.dtype).to(gpu);
  Tensor lse_plain = testing::poisoned({c.batch, c.heads, c.seq_q}, DType::kF32).to(gpu);
  call(ctx, q, k, v, out_fp8, lse_fp8, fp8_options);
  call(ctx, q, k, v, out_plain, lse_plain, c.options);
  const Tensor out_fp8_host = out_fp8.to(Device::cpu()), out_plain_host = out_plain.to(Device::cpu());
  const Fp8Errors fp8 = measure(out_fp8_host, lse_fp8.to(Device::cpu()), ref);
  const Fp8Errors plain = measure(out_plain_host, lse_plain.to(Device::cpu()), ref);
  const double fp8_vs_plain = relative_l2_between(out_fp8_host, out_plain_host);
  std::printf("fp8 attention %s %s: vs fp64 rel-L2 %.4f max %.4f lse %.4f | %s kernel vs fp64 rel-L2 %.5f | fp8 vs %s "
              "rel-L2 %.4f\n",
              describe(c).c_str(), label.c_str(), fp8.relative_l2, fp8.relative_abs, fp8.lse, dtype_name(c.dtype).data(),
              plain.relative_l2, dtype_name(c.dtype).data(), fp8_vs_plain);
  EXPECT_TRUE(fp8.finite) << "NaN or inf left in the output (unwritten or poisoned)";
  EXPECT_TRUE(fp8.lse_pattern_ok) << "lse is -inf exactly for rows with no visible key";
  EXPECT_LE(fp8.relative_l2, kMaxRelativeL2);
  EXPECT_LE(fp8.relative_abs, kMaxRelativeAbs);
  EXPECT_LE(fp8.lse, kMaxLseError);
  EXPECT_LE(fp8_vs_plain, kMaxRelativeL2 + 2.0 * plain.relative_l2);
}

void check_dense(const Case& c, uint64_t seed) {
  const Qkv host = testing::random_qkv(c.batch, c.seq_q, c.seq_kv, c.heads, c.kv_heads, kDim, c.dtype, seed);
  const auto ref = reference::attention(host.q, host.k, host.v, c.options);
  check_fp8_case(c, host, ref, "dense",
                 [](const ExecContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor& lse, const AttentionOptions& options) { attention_forward(ctx, q, k, v, out, lse, options); });
}

void check_sparse(const Case& c, const BlockMask& mask, uint64_t seed) {
  const Qkv host = testing::random_qkv(c.batch, c.seq_q, c.seq_kv, c.heads, c.kv_heads, kDim, c.dtype, seed);
  const auto ref = reference::block_sparse_attention(host.q, host.k, host.v, mask.view(), c.options);
  const BlockMask::DeviceCopy device_mask = mask.to_device(Device::cuda());
  const BlockMaskView view = device_mask.view();
  check_fp8_case(c, host, ref,
                 detail::concat("block-sparse ", mask.shape().block_q, "x", mask.shape().block_kv, " density ",
                                mask.density()),
                 [view](const ExecContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const AttentionOptions& options) {
                   block_sparse_attention_forward(ctx, q, k, v, view, out, lse, options);
                 });
}

class Fp8Gpu : public ::testing::TestWithParam<DType> {};

TEST_P(Fp8Gpu, DenseWithinFp8ErrorOfTheReference) {
  SKIP_WITHOUT_HOPPER();
  const DType dtype = GetParam();
  AttentionOptions causal;
  causal.causal = true;
  AttentionOptions window;
  window.window_left = 300;
  window.window_right = 20;
  const std::vector<Case> cases = {
      {1, 1, 1, 1, 1, dtype, {}},          {2, 257, 257, 4, 2, dtype, {}},       {1, 130, 333, 3, 1, dtype, {}},
      {1, 63, 65, 2, 2, dtype, {}},        {1, 300, 100, 2, 1, dtype, causal},  // the first 200 rows see nothing
      {1, 777, 777, 4, 2, dtype, causal},  {2, 1100, 1100, 2, 1, dtype, window}, {1, 2049, 1531, 2, 1, dtype, {}},
  };
  uint64_t seed = 1101;
  for (const Case& c : cases) check_dense(c, seed++);
}

TEST_P(Fp8Gpu, BlockSparseWithinFp8ErrorOfTheReference) {
  SKIP_WITHOUT_HOPPER();
  const DType dtype = GetParam();
  const int64_t batch = 2, heads = 4, kv_heads = 2;
  uint64_t seed = 1201;
  for (const auto& [block_q, block_kv] : std::vector<std::pair<int64_t, int64_t>>{{128, 64}, {128, 128}, {256, 256}})
    for (const bool causal : {false, true}) {
      const int64_t seq_q = 641 + seed % 5, seq_kv = causal ? seq_q : 899;
      BlockMaskShape shape;
      shape.mask_batch = batch;
      shape.mask_heads = heads;
      shape.seq_q = seq_q;
      shape.seq_kv = seq_kv;
      shape.block_q = block_q;
      shape.block_kv = block_kv;
      const BlockMask mask = BlockMask::random(shape, 0.4, seed);
      Case c{batch, seq_q, seq_kv, heads, kv_heads, dtype, {}};
      c.options.causal = causal;
      check_sparse(c, mask, seed++);
    }
}

// Rows that keep nothing (output 0, LSE -inf), odd kept counts (half-empty last stage), the last
// query and key blocks partial.
TEST_P(Fp8Gpu, BlockSparseEmptyAndOddRows) {
  SKIP_WITHOUT_HOPPER();
  BlockMaskShape shape;
  shape.mask_heads = 2;
  shape.seq_q = 300;  // 3 q blocks of 128, the last partial
  shape.seq_kv = 200; // 4 kv blocks of 64, the last partial
  const BlockMask mask = BlockMask::from_rows(shape, {{0, 3}, {}, {1}, {}, {2, 3}, {0, 1, 2, 3}});
  check_sparse({1, 300, 200, 2, 2, GetParam(), {}}, mask, 1301);
}

INSTANTIATE_TEST_SUITE_P(OutputTypes, Fp8Gpu, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });


TEST(Fp8Gpu, RejectsWhatItCannotRun) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped";
  const Device gpu = Device::cuda();
  AttentionOptions fp8;
  fp8.precision = AttentionPrecision::kFp8;
  Workspace workspace(gpu);
  ExecContext ctx;
  ctx.device = gpu;
  AttentionDims dims{1, 64, 64, 2, 2, 128};
  dims.precision = AttentionPrecision::kFp8;
  workspace.reserve(attention_workspace_bytes(ctx, gpu, dims));
  ctx.workspace = &workspace;
  // Head dim 64: the FP8 mode has 128 only.
  const Tensor q64 = Tensor::empty({1, 64, 2, 64}, DType::kBF16, gpu);
  const Tensor o64 = Tensor::empty({1, 64, 2, 64}, DType::kBF16, gpu);
  expect_error_naming([&] { attention_forward(ctx, q64, q64, q64, o64, {}, fp8); }, "options.precision");
  const Tensor q = Tensor::empty({1, 64, 2, 128}, DType::kBF16, gpu);
  const Tensor o = Tensor::empty({1, 64, 2, 128}, DType::kBF16, gpu);
  if (hopper_device()) {
    // No workspace: the quantized operands have nowhere to go.
    expect_error_naming([&] { attention_forward(ExecContext{}, q, q, q, o, {}, fp8); }, "ctx.workspace");
  } else {
    expect_error_naming([&] { attention_forward(ctx, q, q, q, o, {}, fp8); }, "options.precision");
  }
}

}  // namespace
}  // namespace tessel
