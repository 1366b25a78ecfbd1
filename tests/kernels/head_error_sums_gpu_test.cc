// head_error_sums on CUDA against the CPU sums of the very same values (bf16 and mixed dtypes,
// odd shapes, more tokens than one chunk). Skips (with a message) when no GPU is present.
#include <gtest/gtest.h>

#include <cmath>

#include "tessel/core/device.h"
#include "tessel/core/random.h"
#include "tessel/kernels/head_error_sums.h"

namespace tessel {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

// A random fp32 tensor rounded to `dtype` (kept in fp32 on the host when dtype is fp32).
Tensor rounded(const Shape& shape, DType dtype, uint64_t seed, double stddev) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  fill_normal(t.view(), seed, 0.0, stddev);
  return dtype == DType::kF32 ? t : t.to(dtype).to(DType::kF32);
}

TEST(HeadErrorSumsGpu, MatchesTheCpuSumsOfTheSameValues) {
  SKIP_WITHOUT_GPU();
  struct Case {
    Shape shape;
    DType approx_dtype, reference_dtype;
  };
  const Case cases[] = {{{1, 1000, 3, 64}, DType::kBF16, DType::kBF16},
                        {{2, 333, 5, 24}, DType::kF16, DType::kF32},
                        {{1, 70000, 2, 16}, DType::kBF16, DType::kBF16},  // more chunks than the cap
                        {{1, 3, 1, 8}, DType::kF32, DType::kBF16}};
  uint64_t seed = 3;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "shape " << c.shape[0] << "x" << c.shape[1] << "x" << c.shape[2] << "x" << c.shape[3]);
    const Tensor reference = rounded(c.shape, c.reference_dtype, seed++, 1.0);
    const Tensor approx = rounded(c.shape, c.approx_dtype, seed++, 1.1);
    const HeadErrorSums cpu = head_error_sums(ExecContext{}, approx.view(), reference.view());
    const Tensor approx_gpu = (c.approx_dtype == DType::kF32 ? approx : approx.to(c.approx_dtype)).to(Device::cuda());
    const Tensor reference_gpu = (c.reference_dtype == DType::kF32 ? reference : reference.to(c.reference_dtype)).to(Device::cuda());
    ExecContext ctx;
    ctx.device = Device::cuda();
    const HeadErrorSums gpu = head_error_sums(ctx, approx_gpu.view(), reference_gpu.view());
    ASSERT_EQ(gpu.diff.size(), static_cast<size_t>(c.shape[2]));
    for (size_t h = 0; h < gpu.diff.size(); ++h) {
      SCOPED_TRACE(::testing::Message() << "head " << h);
      // The same values summed in fp64 in another order: agreement to fp64 rounding.
      EXPECT_NEAR(gpu.diff[h], cpu.diff[h], 1e-10 * cpu.diff[h]);
      EXPECT_NEAR(gpu.reference[h], cpu.reference[h], 1e-10 * cpu.reference[h]);
      EXPECT_NEAR(gpu.approx[h], cpu.approx[h], 1e-10 * cpu.approx[h]);
      EXPECT_NEAR(gpu.dot[h], cpu.dot[h], 1e-10 * std::sqrt(cpu.reference[h] * cpu.approx[h]));
    }
    // Deterministic: a rerun gives the identical sums.
    const HeadErrorSums again = head_error_sums(ctx, approx_gpu.view(), reference_gpu.view());
    EXPECT_EQ(again.diff, gpu.diff);
    EXPECT_EQ(again.dot, gpu.dot);
  }
}

}  // namespace
}  // namespace tessel
