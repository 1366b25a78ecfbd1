// The plan-time kernel tuning's interface where no GPU variant exists: the CPU has nothing to tune,
// forcing a variant there is an error, and bad tuning arguments are refused before anything runs.
// (tests/kernels/attention_gpu_test.cc runs every variant against the fp64 oracle on a GPU.)
#include <gtest/gtest.h>

#include <string>

#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/kernels/attention_tuning.h"

namespace tessel {
namespace {

template <typename F>
void expect_error_naming(F&& f, const std::string& name) {
  try {
    f();
    ADD_FAILURE() << "no Error thrown; expected one naming " << name;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(AttentionTuning, CpuHasNothingToTune) {
  const AttentionDims dims{1, 300, 300, 4, 2, 64};
  const AttentionTuning t = tune_attention(ExecContext{}, Device::cpu(), DType::kF32, dims);
  EXPECT_TRUE(t.chosen.empty());
  EXPECT_FALSE(t.cached);
  EXPECT_TRUE(t.median_ms.empty());
  EXPECT_TRUE(attention_kernel_variants(Device::cpu(), 128).empty());
  EXPECT_TRUE(attention_kernel_variants(Device::cpu(), 128, AttentionPrecision::kFp8).empty());
  clear_attention_tuning();  // nothing tuned: a no-op
}

TEST(AttentionTuning, ForcingAVariantOnTheCpuIsAnError) {
  expect_error_naming([] { force_attention_kernel_variant(Device::cpu(), 128, "narrow"); }, "device");
  expect_error_naming([] { force_attention_kernel_variant(Device::cpu(), 128, "fp8", AttentionPrecision::kFp8); },
                      "device");
}

TEST(AttentionTuning, AbsentGpuOrUnknownVariantIsAnError) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present: attention_gpu_test covers the device cases";
  const Device absent = Device::cuda(0);
  EXPECT_TRUE(attention_kernel_variants(absent, 128).empty());
  EXPECT_TRUE(attention_kernel_variants(absent, 128, AttentionPrecision::kFp8).empty());
  const AttentionDims dims{1, 300, 300, 4, 2, 128};
  if (cuda_compiled()) {
    expect_error_naming([&] { tune_attention(ExecContext{}, absent, DType::kBF16, dims); }, "device");
    expect_error_naming([&] { force_attention_kernel_variant(absent, 128, "narrow"); }, "variant");
    expect_error_naming([&] { force_attention_kernel_variant(absent, 128, "fp8", AttentionPrecision::kFp8); }, "variant");
  } else {
    expect_error_naming([&] { tune_attention(ExecContext{}, absent, DType::kBF16, dims); }, "device");
  }
}

}  // namespace
}  // namespace tessel
