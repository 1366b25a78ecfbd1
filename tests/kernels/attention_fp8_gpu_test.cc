// The FP8 (e4m3) mode of the CUDA attention kernels (AttentionPrecision::kFp8: per-64-token q and k
// scales, per-channel v scales, P in e4m3) against the fp64 oracle and against the same call in
// the inputs' precision, dense and block-sparse, on fresh random inputs with odd lengths, partial
// blocks, GQA, causal and window limits, empty rows and LSE — every case under every FP8 variant
// (K smoothing, polynomial exp2, lazy rescaling, ping-pong: attention_kernel_variants with
// kFp8), and keys with large channel offsets (as DiT keys have) that K smoothing must cancel.
// Each case prints its errors per variant (the FP8-vs-bf16 report). Skips without a compute
// capability 9.0 GPU (the only one that runs it).
//
// Bounds: scripts/fp8_attention_emulation.py emulates the quantization and the kernel's online
// softmax (e4m3 rounding of the scaled q/k blocks, of the channel-scaled v and of P over 128-key
// stages, with and without lazy rescaling; the polynomial exp2's 7.5e-5 is far below P's e4m3
// rounding). On the tests' kinds of cases (--test-cases: normal q and k, uniform v on [-1, 1],
// D = 128, 65 to 2049 keys, causal and window limits, 4 draws) it gives a relative L2 output
// error of 0.041-0.055 and a max error of 0.040-0.118 of the largest output for every variant,
// and 0.040-0.054 (max 0.118) with K smoothing on keys with channel offsets of standard
// deviation 4, where the variants without smoothing reach 0.086-0.132 (max 0.26); on the same
// draw, smoothing leaves 0.40-0.49 of the unsmoothed relative L2 error. The tests allow 0.065
// and 0.15, and on offset keys a ratio of 0.75. A wrong scale, key order, fragment layout or mean
// gives errors of order 1.
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
#include "tessel/core/random.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/attention_tuning.h"
#include "tessel/kernels/reference.h"
#include "tessel/sparse/block_mask.h"

namespace tessel {
namespace {

using gpu_test::expect_error_naming;
using gpu_test::hopper_device;
using testing::Qkv;

constexpr int64_t kDim = 128;  // the FP8 mode's head dim
constexpr double kMaxRelativeL2 = 0.065;
constexpr double kMaxRelativeAbs = 0.15;
constexpr double kMaxLseError = 0.5;  // one-key rows carry the whole score's quantization error
// Keys with channel offsets: smoothing's error over the unsmoothed variant's (emulated: 0.40-0.49).
constexpr double kMaxSmoothedOverPlain = 0.75;
constexpr double kKeyOffsetStddev = 4.0;

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

// The FP8 variants the device offers (the plain "fp8" first).
std::vector<std::string> fp8_variants() {
  return attention_kernel_variants(Device::cuda(), kDim, AttentionPrecision::kFp8);
}

bool smooths_k(const std::string& variant) { return variant.find("+smoothk") != std::string::npos; }

// Runs `call` (which writes out and lse with the given options) in FP8 under every FP8 variant and
// once in the inputs' precision, checks each FP8 result against the oracle (only those with K
// smoothing when `offset_keys`, whose unsmoothed errors exceed the bounds by design) and prints all
// errors. Returns each variant's errors, in fp8_variants() order.
std::vector<Fp8Errors> check_fp8_case(
    const Case& c, const Qkv& host, const reference::AttentionResult& ref, const std::string& label, bool offset_keys,
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
  Tensor out_plain = testing::poisoned({c.batch, c.seq_q, c.heads, kDim}, c.dtype).to(gpu);
  Tensor lse_plain = testing::poisoned({c.batch, c.heads, c.seq_q}, DType::kF32).to(gpu);
  call(ctx, q, k, v, out_plain, lse_plain, c.options);
  const Tensor out_plain_host = out_plain.to(Device::cpu());
  const Fp8Errors plain = measure(out_plain_host, lse_plain.to(Device::cpu()), ref);
  const std::vector<std::string> variants = fp8_variants();
  EXPECT_FALSE(variants.empty());
  std::vector<Fp8Errors> errors;
  for (const std::string& variant : variants) {
    SCOPED_TRACE("variant " + variant);
    const gpu_test::ForcedVariant forced(kDim, variant, AttentionPrecision::kFp8);
    Tensor out_fp8 = testing::poisoned({c.batch, c.seq_q, c.heads, kDim}, c.dtype).to(gpu);
    Tensor lse_fp8 = testing::poisoned({c.batch, c.heads, c.seq_q}, DType::kF32).to(gpu);
    call(ctx, q, k, v, out_fp8, lse_fp8, fp8_options);
    const Tensor out_fp8_host = out_fp8.to(Device::cpu());
    const Fp8Errors fp8 = measure(out_fp8_host, lse_fp8.to(Device::cpu()), ref);
    const double fp8_vs_plain = relative_l2_between(out_fp8_host, out_plain_host);
    std::printf("fp8 attention %s %s%s @%s: vs fp64 rel-L2 %.4f max %.4f lse %.4f | %s kernel vs fp64 rel-L2 %.5f | "
                "fp8 vs %s rel-L2 %.4f\n",
                describe(c).c_str(), label.c_str(), offset_keys ? " (offset keys)" : "", variant.c_str(),
                fp8.relative_l2, fp8.relative_abs, fp8.lse, dtype_name(c.dtype).data(), plain.relative_l2,
                dtype_name(c.dtype).data(), fp8_vs_plain);
    EXPECT_TRUE(fp8.finite) << "NaN or inf left in the output (unwritten or poisoned)";
    EXPECT_TRUE(fp8.lse_pattern_ok) << "lse is -inf exactly for rows with no visible key";
    if (!offset_keys || smooths_k(variant)) {
      EXPECT_LE(fp8.relative_l2, kMaxRelativeL2);
      EXPECT_LE(fp8.relative_abs, kMaxRelativeAbs);
      EXPECT_LE(fp8.lse, kMaxLseError);
      EXPECT_LE(fp8_vs_plain, kMaxRelativeL2 + 2.0 * plain.relative_l2);
    }
    errors.push_back(fp8);
  }
  return errors;
}

// Keys with channel offsets of kKeyOffsetStddev per (batch, kv head, channel), as DiT keys carry:
// smoothing must take them out, the other variants only print their (larger) errors.
void offset_keys(Qkv& host, uint64_t seed) {
  const int64_t batch = host.k.size(0), seq = host.k.size(1), heads = host.k.size(2);
  Tensor k = Tensor::empty({batch, seq, heads, kDim}, DType::kF32);
  Tensor offsets = Tensor::empty({batch, heads, kDim}, DType::kF32);
  fill_normal(k.view(), seed);
  fill_normal(offsets.view(), seed + 1, 0.0, kKeyOffsetStddev);
  float* kp = k.data_as<float>();
  const float* op = offsets.data_as<const float>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < kDim; ++d) kp[((b * seq + s) * heads + h) * kDim + d] += op[(b * heads + h) * kDim + d];
  host.k = k.to(host.k.dtype());
}

// On offset keys, every smoothing variant beats the unsmoothed default by kMaxSmoothedOverPlain.
void expect_smoothing_pays(const std::vector<Fp8Errors>& errors) {
  const std::vector<std::string> variants = fp8_variants();
  ASSERT_EQ(errors.size(), variants.size());
  ASSERT_FALSE(smooths_k(variants.front()));
  for (size_t n = 1; n < variants.size(); ++n)
    if (smooths_k(variants[n]))
      EXPECT_LE(errors[n].relative_l2, kMaxSmoothedOverPlain * errors.front().relative_l2) << variants[n];
}

std::vector<Fp8Errors> check_dense(const Case& c, uint64_t seed, bool with_offset_keys = false) {
  Qkv host = testing::random_qkv(c.batch, c.seq_q, c.seq_kv, c.heads, c.kv_heads, kDim, c.dtype, seed);
  if (with_offset_keys) offset_keys(host, seed);
  const auto ref = reference::attention(host.q, host.k, host.v, c.options);
  return check_fp8_case(
      c, host, ref, "dense", with_offset_keys,
      [](const ExecContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
         const AttentionOptions& options) { attention_forward(ctx, q, k, v, out, lse, options); });
}

std::vector<Fp8Errors> check_sparse(const Case& c, const BlockMask& mask, uint64_t seed, bool with_offset_keys = false) {
  Qkv host = testing::random_qkv(c.batch, c.seq_q, c.seq_kv, c.heads, c.kv_heads, kDim, c.dtype, seed);
  if (with_offset_keys) offset_keys(host, seed);
  const auto ref = reference::block_sparse_attention(host.q, host.k, host.v, mask.view(), c.options);
  const BlockMask::DeviceCopy device_mask = mask.to_device(Device::cuda());
  const BlockMaskView view = device_mask.view();
  return check_fp8_case(c, host, ref,
                        detail::concat("block-sparse ", mask.shape().block_q, "x", mask.shape().block_kv, " density ",
                                       mask.density()),
                        with_offset_keys,
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

// K smoothing on keys with channel offsets: GQA (the q rows' LSE shifts use their kv head's
// means), partial blocks, causal rows that see nothing (LSE -inf stays), a block mask.
TEST_P(Fp8Gpu, SmoothingCancelsKeyChannelOffsets) {
  SKIP_WITHOUT_HOPPER();
  const DType dtype = GetParam();
  AttentionOptions causal;
  causal.causal = true;
  expect_smoothing_pays(check_dense({2, 333, 333, 4, 2, dtype, {}}, 1401, true));
  expect_smoothing_pays(check_dense({1, 300, 100, 2, 1, dtype, causal}, 1402, true));
  expect_smoothing_pays(check_dense({1, 1100, 1531, 2, 2, dtype, {}}, 1403, true));
  BlockMaskShape shape;
  shape.mask_batch = 1;
  shape.mask_heads = 4;
  shape.seq_q = 700;
  shape.seq_kv = 900;
  const BlockMask mask = BlockMask::random(shape, 0.4, 1404);
  expect_smoothing_pays(check_sparse({1, 700, 900, 4, 2, dtype, {}}, mask, 1404, true));
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
    // FP8 variants are FP8's names at head dim 128 only: not 16-bit ones, not other head dims.
    EXPECT_EQ(fp8_variants().front(), "fp8");
    EXPECT_TRUE(attention_kernel_variants(gpu, 64, AttentionPrecision::kFp8).empty());
    expect_error_naming([] { force_attention_kernel_variant(Device::cuda(), 128, "wide", AttentionPrecision::kFp8); },
                        "variant");
    expect_error_naming([] { force_attention_kernel_variant(Device::cuda(), 128, "fp8"); }, "variant");
    expect_error_naming([] { force_attention_kernel_variant(Device::cuda(), 128, "fp8+lazy", AttentionPrecision::kFp8); },
                        "variant");  // a combination without an instantiation
    expect_error_naming([] { force_attention_kernel_variant(Device::cuda(), 64, "fp8", AttentionPrecision::kFp8); },
                        "variant");
  } else {
    expect_error_naming([&] { attention_forward(ctx, q, q, q, o, {}, fp8); }, "options.precision");
  }
}

}  // namespace
}  // namespace tessel
