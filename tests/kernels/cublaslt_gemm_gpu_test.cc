// CublasLtGemm's entry points for adding a low-rank update into a linear's output (the per-request
// LoRA path): linear() with no epilogue (the shrink) and accumulate() (y += alpha x w^T in place,
// the expand), against an fp64 host product of the same bf16-rounded operands. Shapes include
// ranks 5 and 64, row slices whose pointers are less than 256-byte aligned, and bf16 and fp32
// outputs; outputs are poisoned (NaN) where the call must overwrite them. Skips without a GPU.
//
// Bound per element: the product is accumulated in fp32 (relative error about k * 2^-24 of the sum
// of |terms|; 1e-5 of it covers k <= 160) and rounded to the output type: linear() once (half an
// ulp: 2^-9 of |value| for bf16); accumulate() into a bf16 y twice on the H200 (measured up to one
// bf16 ulp of the result: alpha x w^T is rounded to bf16 before y0 is added, half an ulp of each).
// So |got - ref| <= 2^-8 (|ref| + |alpha sum x w| when y0 is added) (bf16 output; fp32: 0) +
// 1e-5 (|y0| + |alpha| sum |x w|). A missing alpha, a dropped y0 (beta 0) or a product on the wrong
// rows is far outside.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "tessel/core/tensor.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>

#include "tessel/kernels/cuda/cublaslt_gemm.h"
#endif

namespace tessel {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

#ifdef TESSEL_WITH_CUDA
using cuda::CublasLtGemm;
using cuda::GemmEpilogue;
using cuda::GemmShape;

// A random (rows, cols) fp32 host tensor holding values exactly representable in `dtype`.
Tensor random_matrix(int64_t rows, int64_t cols, DType dtype, uint64_t seed, double scale) {
  Tensor t = Tensor::empty({rows, cols}, DType::kF32);
  fill_uniform(t.view(), seed, -scale, scale);
  return dtype == DType::kF32 ? t : t.to(dtype).to(DType::kF32);
}

// The host fp32 values in `dtype` on the GPU.
Tensor on_gpu(const Tensor& values, DType dtype) { return (dtype == DType::kF32 ? values : values.to(dtype)).to(Device::cuda()); }

Tensor to_host_f32(const Tensor& device_tensor) {
  const Tensor host = device_tensor.to(Device::cpu());
  return host.dtype() == DType::kF32 ? host : host.to(DType::kF32);
}

// Checks rows [first, rows) of `got` against y0 + alpha x w^T (y0 null: zero), rows before `first`
// against `untouched`.
void expect_product(const Tensor& got, const Tensor& x, const Tensor& w, const Tensor* y0, double alpha, int64_t first,
                    const Tensor& untouched, DType output) {
  const int64_t rows = x.size(0), k = x.size(1), n = w.size(0);
  const float *xs = x.data_as<float>(), *ws = w.data_as<float>(), *gs = got.data_as<float>();
  const double relative = output == DType::kBF16 ? std::ldexp(1.0, -8) : 0.0;
  int failures = 0;
  for (int64_t r = 0; r < rows && failures < 5; ++r)
    for (int64_t c = 0; c < n && failures < 5; ++c) {
      const double value = gs[r * n + c];
      if (r < first) {  // outside the call: as it was (NaN poison included)
        const double before = untouched.data_as<float>()[r * n + c];
        if (!(value == before || (std::isnan(value) && std::isnan(before)))) {
          ++failures;
          ADD_FAILURE() << "row " << r << " is outside the call but changed: " << value << " (was " << before << ")";
        }
        continue;
      }
      double sum = 0, magnitude = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double term = static_cast<double>(xs[r * k + i]) * ws[c * k + i];
        sum += term;
        magnitude += std::fabs(term);
      }
      const double base = y0 ? y0->data_as<float>()[r * n + c] : 0.0;
      const double reference = base + alpha * sum;
      const double rounded = std::fabs(reference) + (y0 ? std::fabs(alpha * sum) : 0.0);
      const double bound = relative * rounded + 1e-5 * (std::fabs(base) + std::fabs(alpha) * magnitude);
      if (!(std::fabs(value - reference) <= bound)) {
        ++failures;
        ADD_FAILURE() << "(" << r << ", " << c << "): " << value << " vs " << reference << " (bound " << bound << ")";
      }
    }
}

struct Case {
  int64_t rows, n, k, first;  // the call covers rows [first, rows)
  DType output;
};
#endif

TEST(CublasLtGemmGpu, ShrinkAndInPlaceAccumulateMatchTheHostProduct) {
  SKIP_WITHOUT_GPU();
#ifdef TESSEL_WITH_CUDA
  const CublasLtGemm gemm;
  const Tensor workspace = Tensor::empty({static_cast<int64_t>(CublasLtGemm::kWorkspaceBytes)}, DType::kU8, Device::cuda());
  // LoRA-like shapes: shrink to rank 5 / 64, expand from them; row slices starting at odd rows
  // (pointers aligned to 2..128 bytes), a deep product, an fp32 output.
  const Case cases[] = {{37, 5, 64, 0, DType::kBF16},   {300, 64, 96, 3, DType::kBF16}, {129, 72, 5, 1, DType::kBF16},
                        {256, 160, 64, 0, DType::kF32}, {65, 40, 5, 7, DType::kF32},    {100, 48, 160, 0, DType::kBF16}};
  uint64_t seed = 11;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.n << "x" << c.k << " from row " << c.first << " -> "
                                      << dtype_name(c.output));
    const Tensor x = random_matrix(c.rows, c.k, DType::kBF16, ++seed, 1.0), w = random_matrix(c.n, c.k, DType::kBF16, ++seed, 0.5);
    const Tensor y0 = random_matrix(c.rows, c.n, c.output, ++seed, 4.0);
    const Tensor x_gpu = on_gpu(x, DType::kBF16), w_gpu = on_gpu(w, DType::kBF16);
    const size_t out_size = dtype_size(c.output);
    const auto* x_rows = static_cast<const std::byte*>(x_gpu.data()) + c.first * c.k * 2;
    const int64_t m = c.rows - c.first;

    // linear() without epilogue into a poisoned output (rows before `first` keep the poison).
    Tensor poison = Tensor::empty({c.rows, c.n}, DType::kF32);
    fill(poison.view(), std::nan(""));
    Tensor y_gpu = on_gpu(poison, c.output);
    auto* y_rows = static_cast<std::byte*>(y_gpu.data()) + static_cast<size_t>(c.first * c.n) * out_size;
    GemmShape shape{m, c.n, c.k, DType::kBF16, c.output, GemmEpilogue::kNone};
    shape.alignment = CublasLtGemm::alignment_of({x_rows, w_gpu.data(), y_rows});
    gemm.linear(shape, x_rows, w_gpu.data(), nullptr, y_rows, workspace.data(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    {
      SCOPED_TRACE("linear");
      expect_product(to_host_f32(y_gpu), x, w, nullptr, 1.0, c.first, to_host_f32(on_gpu(poison, c.output)), c.output);
    }

    // accumulate(): y = y0 + alpha x w^T on the same rows, rows before `first` untouched.
    y_gpu = on_gpu(y0, c.output);
    y_rows = static_cast<std::byte*>(y_gpu.data()) + static_cast<size_t>(c.first * c.n) * out_size;
    shape.alignment = CublasLtGemm::alignment_of({x_rows, w_gpu.data(), y_rows});
    gemm.accumulate(shape, x_rows, w_gpu.data(), -0.75f, y_rows, workspace.data(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    SCOPED_TRACE("accumulate");
    expect_product(to_host_f32(y_gpu), x, w, &y0, -0.75, c.first, y0, c.output);
  }
#endif
}

TEST(CublasLtGemmGpu, RefusesAnEpilogueOnAccumulateAndLessAlignedPointers) {
  SKIP_WITHOUT_GPU();
#ifdef TESSEL_WITH_CUDA
  const CublasLtGemm gemm;
  const Tensor workspace = Tensor::empty({static_cast<int64_t>(CublasLtGemm::kWorkspaceBytes)}, DType::kU8, Device::cuda());
  const Tensor x = Tensor::empty({16, 32}, DType::kBF16, Device::cuda()), w = Tensor::empty({16, 32}, DType::kBF16, Device::cuda());
  const Tensor bias = Tensor::empty({16}, DType::kBF16, Device::cuda());
  Tensor y = Tensor::empty({16, 16}, DType::kBF16, Device::cuda());
  EXPECT_THROW(gemm.accumulate(GemmShape{16, 16, 32, DType::kBF16, DType::kBF16, GemmEpilogue::kBias}, x.data(), w.data(), 1.0f,
                               y.data(), workspace.data(), nullptr),
               Error);
  // A row slice 64 bytes in, with the default (256-byte) alignment: refused, not run.
  const auto* shifted = static_cast<const std::byte*>(x.data()) + 64;
  EXPECT_EQ(CublasLtGemm::alignment_of({shifted, w.data()}), 64u);
  EXPECT_THROW(gemm.linear(GemmShape{15, 16, 32, DType::kBF16, DType::kBF16, GemmEpilogue::kNone}, shifted, w.data(), nullptr, y.data(),
                           workspace.data(), nullptr),
               Error);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
#endif
}

}  // namespace
}  // namespace tessel
