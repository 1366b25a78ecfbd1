#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "tessel/core/error.h"
#include "tessel/core/parallel.h"
#include "tessel/core/random.h"
#include "tessel/core/tensor.h"

namespace tessel {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between two bf16 values (1 and 1 + 2^-7): ties go to even (1).
  EXPECT_EQ(float_to_bf16(1.0f + 0x1.0p-8f), float_to_bf16(1.0f));
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up to even.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * 0x1.0p-8f)), 1.0f + 0x1.0p-6f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1.8p-8f)), 1.0f + 0x1.0p-7f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(INFINITY)), INFINITY);
}

TEST(DType, HalfMatchesExhaustiveRoundTrip) {
  // Every finite half converts to float and back to itself.
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = half_to_float(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), h) << "bits=" << bits;
  }
  // Ties to even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(float_to_half(1.0f + 0x1.0p-11f), float_to_half(1.0f));
  EXPECT_EQ(half_to_float(float_to_half(1.0f + 3 * 0x1.0p-11f)), 1.0f + 0x1.0p-9f);
  EXPECT_EQ(half_to_float(float_to_half(70000.0f)), INFINITY);
  EXPECT_EQ(half_to_float(float_to_half(65519.0f)), 65504.0f);
  EXPECT_EQ(half_to_float(float_to_half(0x1.0p-24f)), 0x1.0p-24f);  // smallest subnormal
  EXPECT_EQ(half_to_float(float_to_half(0x1.0p-26f)), 0.0f);
}

TEST(DType, ParseNamesAndRejectsUnknown) {
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("float16"), DType::kF16);
  try {
    parse_dtype("int4");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("int4"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("dtype"), std::string::npos);
  }
}

TEST(Tensor, ShapesStridesAndContiguity) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::kBF16);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.view().strides(), (Shape{12, 4, 1}));
  EXPECT_TRUE(t.view().is_contiguous());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % kHostAlignment, 0u);
  TensorView transposed(t.data(), DType::kBF16, Device::cpu(), {3, 2, 4}, {4, 12, 1});
  EXPECT_FALSE(transposed.is_contiguous());
  EXPECT_THROW(check_contiguous(transposed, "q"), Error);
  EXPECT_THROW(TensorView(nullptr, DType::kF32, Device::cpu(), {2, -1}), Error);
}

TEST(Tensor, ExtentsWhoseProductOverflowsAreAnError) {
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  // Zero elements, but the strides of the contiguous layout would overflow.
  EXPECT_THROW(Tensor::empty({0, kHuge, kHuge}, DType::kF32), Error);
  EXPECT_THROW(shape_numel({kHuge, 2}), Error);
  EXPECT_EQ(shape_numel({kHuge, 0}), 0);
}

TEST(Tensor, ConvertAndRandomFillAreDeterministic) {
  Tensor a = Tensor::empty({64}, DType::kF32);
  Tensor b = Tensor::empty({64}, DType::kF32);
  fill_normal(a.view(), 42);
  fill_normal(b.view(), 42);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(a.data_as<float>()[i], b.data_as<float>()[i]);
  Tensor h = a.to(DType::kBF16);
  for (int i = 0; i < 64; ++i)
    EXPECT_EQ(h.data_as<uint16_t>()[i], float_to_bf16(a.data_as<float>()[i]));
  Tensor back = h.to(DType::kF32);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(back.data_as<float>()[i], a.data_as<float>()[i], 1e-2 * std::abs(a.data_as<float>()[i]) + 1e-6);
}

// The fills run in parallel chunks, each jumping the generator ahead to its first element: the
// values must be those of one serial walk of the generator, for every thread count and across
// chunk boundaries (a length of several chunks plus a partial one), contiguous and strided alike.
TEST(Tensor, ParallelRandomFillsEqualTheSerialWalk) {
  const int64_t n = 3 * (int64_t{1} << 16) + 4097;
  SplitMix64 rng{7};
  std::vector<double> normal(static_cast<size_t>(n)), uniform(static_cast<size_t>(n));
  for (double& v : normal) {
    const double u1 = 1.0 - rng.uniform01(), u2 = rng.uniform01();
    v = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
  rng = SplitMix64{7};
  for (double& v : uniform) v = -1.0 + 2.0 * rng.uniform01();
  for (const int threads : {1, 3}) {
    set_num_threads(threads);
    Tensor a = Tensor::empty({n}, DType::kF32), b = Tensor::empty({n}, DType::kF32);
    fill_normal(a.view(), 7);
    fill_uniform(b.view(), 7);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(a.data_as<float>()[i], static_cast<float>(normal[static_cast<size_t>(i)])) << "element " << i << ", " << threads << " threads";
      ASSERT_EQ(b.data_as<float>()[i], static_cast<float>(uniform[static_cast<size_t>(i)])) << "element " << i << ", " << threads << " threads";
    }
  }
  set_num_threads(0);
  // A strided view takes the serial path: the same values in its own element order.
  Tensor wide = Tensor::empty({4, 2}, DType::kF32);
  const TensorView column(wide.data(), DType::kF32, Device::cpu(), {4}, {2});
  fill_uniform(column, 7);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(wide.data_as<float>()[2 * i], static_cast<float>(uniform[static_cast<size_t>(i)]));
}

TEST(Tensor, CheckHelpersNameTheArgument) {
  Tensor t = Tensor::empty({2, 3}, DType::kF16);
  try {
    check_dtype(t, DType::kF32, "k");
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("k:"), std::string::npos);
    EXPECT_NE(m.find("fp32"), std::string::npos);
    EXPECT_NE(m.find("fp16"), std::string::npos);
  }
  EXPECT_THROW(check_shape(t, {3, 2}, "v"), Error);
  EXPECT_THROW(check_rank(t, 4, "q"), Error);
  EXPECT_THROW(check_device(t, Device::cuda(0), "q"), Error);
  if (!cuda_available()) {
    EXPECT_THROW(Tensor::empty({4}, DType::kF32, Device::cuda(0)), Error);
  }
}

}  // namespace
}  // namespace tessel
