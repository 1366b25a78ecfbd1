// FP8 linear layers on the GPU: the row-wise e4m3 quantiser (tessel/kernels/cuda/fp8_rows.h), the
// scale / bias / GELU epilogue kernel, and CublasLtGemm::linear_fp8 (per-token x per-channel
// scales through cuBLASLt's outer-vector scale mode where it has one, and through our epilogue
// kernel: both routes run every case). Skips without a GPU of compute capability 8.9 or
// later (FP8 tensor cores). Every case prints its measured errors.
//
// Bounds:
//  - quantiser: bit-exact against a host reference doing the same fp32 operations (absmax,
//    448 / absmax, x * factor, round to nearest e4m3 saturating: cuda_fp8.h's host conversion).
//  - GEMM against the fp32 (double-accumulated) product of the DEQUANTISED operands: the same
//    values exactly, so only the accumulation differs (Hopper's FP8 tensor cores add a chunk of
//    products with fewer mantissa bits than fp32 before cuBLASLt promotes to fp32: ~2^-13
//    relative per output at K <= 1536 here) and the output's rounding to bf16 (2^-9 relative at
//    most, rel-L2 ~1e-3). Allowed rel-L2: 4e-3. A wrong scale vector
//    (swapped A/B scales, a scale applied twice), a transposed operand or a lost bias moves it by
//    order 1.
//  - GEMM against the fp32 product of the UNQUANTISED operands: e4m3 keeps 3 mantissa bits, a
//    relative rounding of at most 2^-4 per element (RMS ~0.026 on normal data); two operands
//    give ~0.037 per product, and a dot product of independent errors keeps that relative size:
//    measured ~0.03-0.04 expected, allowed 0.07 (and at least 5e-3: the quantisation is real).
//  - planted outlier output channels (weight rows x1000) and an outlier token (x1000): with
//    per-channel x per-token scales every other channel keeps the ordinary error (same 0.07
//    bound, measured on the other channels only); a per-tensor scale (printed beside it, host
//    emulation) would push the ordinary rows 1000x down into e4m3's subnormals.
#include <gtest/gtest.h>

// A build without CUDA has none of these kernels or cuBLASLt to link: one skipped test says so.
#ifndef TESSEL_WITH_CUDA
TEST(Fp8Linear, NeedsACudaBuild) { GTEST_SKIP() << "tessel built without CUDA: the FP8 linear GPU tests are not compiled"; }
#else
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/linear_epilogue.h"
#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "tessel/core/tensor.h"
#include "tessel/kernels/cuda/cublaslt_gemm.h"
#include "tessel/kernels/cuda/fp8_rows.h"

namespace tessel {
namespace {

using tessel::cuda::CublasLtGemm;
using tessel::cuda::GemmEpilogue;
using tessel::cuda::GemmShape;

bool fp8_gpu() {
  int count = 0, device = 0, major = 0, minor = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major * 10 + minor >= 89;
}

#define SKIP_WITHOUT_FP8_GPU() \
  if (!fp8_gpu()) GTEST_SKIP() << "no GPU of compute capability 8.9+ visible (FP8 tensor cores): GPU test skipped"

float e4m3_value(uint8_t byte) {
  __nv_fp8_e4m3 v;
  v.__x = byte;
  return static_cast<float>(v);
}

// The host reference of launch_quantize_rows_fp8: the same fp32 operations.
void quantize_rows_host(const std::vector<float>& x, int64_t rows, int64_t cols, std::vector<uint8_t>& q, std::vector<float>& scales) {
  q.assign(static_cast<size_t>(rows * cols), 0);
  scales.assign(static_cast<size_t>(rows), 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    float absmax = 0.f;
    for (int64_t c = 0; c < cols; ++c) absmax = std::max(absmax, std::fabs(x[r * cols + c]));
    const float factor = absmax > 0.f ? 448.0f / absmax : 1.f;
    scales[r] = absmax > 0.f ? absmax / 448.0f : 1.f;
    for (int64_t c = 0; c < cols; ++c)
      q[r * cols + c] = __nv_cvt_float_to_fp8(x[r * cols + c] * factor, __NV_SATFINITE, __NV_E4M3);
  }
}

std::vector<float> dequantized(const std::vector<uint8_t>& q, const std::vector<float>& scales, int64_t cols) {
  std::vector<float> out(q.size());
  for (size_t i = 0; i < q.size(); ++i) out[i] = e4m3_value(q[i]) * scales[i / static_cast<size_t>(cols)];
  return out;
}

std::vector<float> bf16_rounded(std::vector<float> x) {
  for (float& v : x) v = __bfloat162float(__float2bfloat16(v));
  return x;
}

std::vector<float> random_normal(int64_t count, uint64_t seed) {
  Tensor t = Tensor::empty({count}, DType::kF32);
  fill_normal(t.view(), seed);
  return std::vector<float>(t.data_as<float>(), t.data_as<float>() + count);
}

template <typename T>
Tensor device_copy(const std::vector<T>& host, DType dtype) {
  Tensor t = Tensor::empty({static_cast<int64_t>(host.size())}, dtype, Device::cuda());
  EXPECT_EQ(cudaMemcpy(t.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return t;
}

template <typename T>
std::vector<T> host_copy(const Tensor& t) {
  std::vector<T> host(static_cast<size_t>(t.nbytes() / sizeof(T)));
  EXPECT_EQ(cudaMemcpy(host.data(), t.data(), t.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

std::vector<uint16_t> to_bf16_bits(const std::vector<float>& x) {
  std::vector<uint16_t> bits(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const __nv_bfloat16 b = __float2bfloat16(x[i]);
    std::memcpy(&bits[i], &b, 2);
  }
  return bits;
}

std::vector<float> from_bf16_bits(const std::vector<uint16_t>& bits) {
  std::vector<float> x(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    __nv_bfloat16 b;
    std::memcpy(&b, &bits[i], 2);
    x[i] = __bfloat162float(b);
  }
  return x;
}

float gelu_tanh(float x) { return 0.5f * x * (1.f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x))); }

// y (m, n) = x (m, k) · w (n, k)^T (+ bias) (GELU), accumulated in double.
std::vector<float> reference_linear(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>* bias, int64_t m,
                                    int64_t k, int64_t n, bool gelu) {
  std::vector<float> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t l = 0; l < k; ++l) sum += static_cast<double>(x[i * k + l]) * w[j * k + l];
      float v = static_cast<float>(sum) + (bias ? (*bias)[j] : 0.f);
      y[i * n + j] = gelu ? gelu_tanh(v) : v;
    }
  return y;
}

// ||a - b|| / ||b|| over the output columns `keep` says (all when empty).
double rel_l2(const std::vector<float>& a, const std::vector<float>& b, int64_t n = 1, const std::vector<bool>& keep = {}) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!keep.empty() && !keep[i % static_cast<size_t>(n)]) continue;
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

TEST(Fp8Rows, QuantiserMatchesTheHostReferenceBitForBit) {
  SKIP_WITHOUT_FP8_GPU();
  const int64_t rows = 37, cols = 200;
  std::vector<float> x = random_normal(rows * cols, 3);
  for (int64_t c = 0; c < cols; ++c) x[5 * cols + c] = 0.f;  // an all-zero row: scale 1, zero bytes
  x[9 * cols + 17] = 3.0e4f;                                    // an outlier: its row's absmax
  for (int64_t c = 0; c < cols; ++c) x[11 * cols + c] *= 1e-6f;  // a tiny row keeps its precision
  for (const DType input : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(std::string(dtype_name(input)));
    const std::vector<float> values = input == DType::kBF16 ? bf16_rounded(x) : x;
    std::vector<uint8_t> expected_q;
    std::vector<float> expected_scales;
    quantize_rows_host(values, rows, cols, expected_q, expected_scales);
    const Tensor source = input == DType::kBF16 ? device_copy(to_bf16_bits(values), DType::kBF16) : device_copy(values, DType::kF32);
    Tensor q = device_copy(std::vector<uint8_t>(static_cast<size_t>(rows * cols), 0x7f), DType::kU8);  // poisoned (NaN bytes)
    Tensor scales = device_copy(std::vector<float>(static_cast<size_t>(rows), NAN), DType::kF32);
    tessel::cuda::launch_quantize_rows_fp8(source.data(), input, rows, cols, q.data_as<uint8_t>(), scales.data_as<float>(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint8_t> got_q = host_copy<uint8_t>(q);
    const std::vector<float> got_scales = host_copy<float>(scales);
    int64_t byte_mismatches = 0, scale_mismatches = 0;
    for (size_t i = 0; i < got_q.size(); ++i) byte_mismatches += got_q[i] != expected_q[i];
    for (size_t i = 0; i < got_scales.size(); ++i) scale_mismatches += std::memcmp(&got_scales[i], &expected_scales[i], 4) != 0;
    std::printf("[quantiser %s] %lld x %lld: %lld byte and %lld scale mismatches against the host reference\n", dtype_name(input).data(),
                static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(byte_mismatches),
                static_cast<long long>(scale_mismatches));
    EXPECT_EQ(byte_mismatches, 0);
    EXPECT_EQ(scale_mismatches, 0);
    EXPECT_EQ(got_scales[5], 1.0f);
    // Dequantised, every row is within e4m3's half-ulp of its values (2^-4 relative) or its
    // subnormal step (2^-9 of the row's absmax / 448 ... scale * 2^-10 absolute).
    const std::vector<float> back = dequantized(got_q, got_scales, cols);
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float scale = got_scales[static_cast<size_t>(i / cols)];
      ASSERT_LE(std::fabs(back[i] - values[i]), std::max(0.0626f * std::fabs(values[i]), scale * 0.001f)) << "element " << i;
    }
  }
  try {
    tessel::cuda::launch_quantize_rows_fp8(nullptr, DType::kBF16, 1, 12, nullptr, nullptr, nullptr);
    ADD_FAILURE() << "cols 12 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cols"), std::string::npos) << e.what();
  }
}

TEST(Fp8Rows, OwnEpilogueKernelAppliesScalesBiasAndGelu) {
  SKIP_WITHOUT_FP8_GPU();
  // n 48 takes the vectorised bf16 kernel, n 44 the element-wise one.
  for (const int64_t n : {48, 44}) {
    const int64_t m = 9;
    const std::vector<float> y = bf16_rounded(random_normal(m * n, 5)), bias = bf16_rounded(random_normal(n, 6));
    std::vector<float> row_scales = random_normal(m, 7), col_scales = random_normal(n, 8);
    for (float& v : row_scales) v = std::fabs(v) + 0.1f;
    for (float& v : col_scales) v = std::fabs(v) + 0.1f;
    const Tensor rows = device_copy(row_scales, DType::kF32), cols = device_copy(col_scales, DType::kF32);
    for (const DType type : {DType::kF32, DType::kBF16})
      for (const bool gelu : {false, true})
        for (const bool scaled : {false, true}) {
          std::vector<float> expected(y.size());
          for (size_t i = 0; i < y.size(); ++i) {
            const size_t row = i / static_cast<size_t>(n), col = i % static_cast<size_t>(n);
            const float v = (scaled ? y[i] * row_scales[row] * col_scales[col] : y[i]) + bias[col];
            expected[i] = gelu ? gelu_tanh(v) : v;
          }
          const float* row_pointer = scaled ? rows.data_as<float>() : nullptr;
          const float* col_pointer = scaled ? cols.data_as<float>() : nullptr;
          std::vector<float> got;
          if (type == DType::kF32) {
            Tensor out = device_copy(y, DType::kF32);
            const Tensor b = device_copy(bias, DType::kF32);
            tessel::cuda::launch_linear_epilogue(out.data(), type, b.data(), m, n, gelu, nullptr, row_pointer, col_pointer);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            got = host_copy<float>(out);
          } else {
            Tensor out = device_copy(to_bf16_bits(y), DType::kBF16);
            const Tensor b = device_copy(to_bf16_bits(bias), DType::kBF16);
            tessel::cuda::launch_linear_epilogue(out.data(), type, b.data(), m, n, gelu, nullptr, row_pointer, col_pointer);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            got = from_bf16_bits(host_copy<uint16_t>(out));
          }
          const double error = rel_l2(got, expected);
          std::printf("[own epilogue n %lld %s, gelu %d, scaled %d] rel-L2 %.3e\n", static_cast<long long>(n), dtype_name(type).data(),
                      gelu, scaled, error);
          // fp32: tanhf against std::tanh, a few ulp; bf16: one rounding of the result (2^-9 relative).
          EXPECT_LE(error, type == DType::kF32 ? 1e-6 : 4e-3);
        }
  }
}

struct GemmCase {
  int64_t m, k, n;
  GemmEpilogue epilogue;
  DType output;
  bool outliers;
};

std::string describe(const GemmCase& c) {
  const char* epilogue = c.epilogue == GemmEpilogue::kBias ? "bias" : c.epilogue == GemmEpilogue::kBiasGeluTanh ? "bias+gelu" : "none";
  return detail::concat("m ", c.m, " k ", c.k, " n ", c.n, " ", epilogue, " -> ", dtype_name(c.output), c.outliers ? " with outliers" : "");
}

TEST(Fp8Linear, MatchesTheDequantisedFp32ProductAndStaysNearTheUnquantisedOne) {
  SKIP_WITHOUT_FP8_GPU();
  const std::vector<GemmCase> cases = {
      {1, 64, 48, GemmEpilogue::kBias, DType::kBF16, false},
      {7, 128, 128, GemmEpilogue::kBiasGeluTanh, DType::kBF16, false},
      {129, 256, 384, GemmEpilogue::kBias, DType::kBF16, false},
      {333, 1536, 272, GemmEpilogue::kBiasGeluTanh, DType::kBF16, false},
      {250, 512, 96, GemmEpilogue::kNone, DType::kBF16, false},
      {61, 384, 160, GemmEpilogue::kBias, DType::kBF16, false},
      {257, 512, 256, GemmEpilogue::kBias, DType::kBF16, true},
      {95, 1024, 128, GemmEpilogue::kBiasGeluTanh, DType::kBF16, true},
  };
  const CublasLtGemm automatic, own_scaling(tessel::cuda::Fp8ScaleRoute::kOwnEpilogue);
  Tensor workspace = Tensor::empty({static_cast<int64_t>(CublasLtGemm::kWorkspaceBytes)}, DType::kU8, Device::cuda());
  for (const CublasLtGemm* route : {&automatic, &own_scaling}) {
  const CublasLtGemm& gemm = *route;
  uint64_t seed = 40;
  for (const GemmCase& c : cases) {
    SCOPED_TRACE(describe(c) + (route == &automatic ? " (automatic route)" : " (our scaling)"));
    // bf16 operands, as the model's activations and weights are before quantisation.
    std::vector<float> x = random_normal(c.m * c.k, ++seed), w = random_normal(c.n * c.k, ++seed);
    for (float& v : w) v *= 1.0f / std::sqrt(static_cast<float>(c.k));
    std::vector<bool> ordinary(static_cast<size_t>(c.n), true);
    if (c.outliers) {
      for (int64_t j = 3; j < c.n; j += 37) {  // planted outlier output channels
        ordinary[static_cast<size_t>(j)] = false;
        for (int64_t l = 0; l < c.k; ++l) w[j * c.k + l] *= 1000.f;
      }
      for (int64_t l = 0; l < c.k; ++l) x[(c.m / 2) * c.k + l] *= 1000.f;  // an outlier token
    }
    x = bf16_rounded(x);
    w = bf16_rounded(w);
    std::vector<float> bias = random_normal(c.n, ++seed);
    for (float& v : bias) v *= 0.1f;
    if (c.output == DType::kBF16) bias = bf16_rounded(bias);
    const bool gelu = c.epilogue == GemmEpilogue::kBiasGeluTanh;
    const bool with_bias = c.epilogue != GemmEpilogue::kNone;

    std::vector<uint8_t> xq, wq;
    std::vector<float> xs, ws;
    quantize_rows_host(x, c.m, c.k, xq, xs);
    quantize_rows_host(w, c.n, c.k, wq, ws);
    // The operands quantised on the device (bit-equal to the host's, checked above).
    const Tensor x_bf16 = device_copy(to_bf16_bits(x), DType::kBF16), w_bf16 = device_copy(to_bf16_bits(w), DType::kBF16);
    Tensor x8 = Tensor::empty({c.m * c.k}, DType::kU8, Device::cuda()), w8 = Tensor::empty({c.n * c.k}, DType::kU8, Device::cuda());
    Tensor x_scales = Tensor::empty({c.m}, DType::kF32, Device::cuda()), w_scales = Tensor::empty({c.n}, DType::kF32, Device::cuda());
    tessel::cuda::launch_quantize_rows_fp8(x_bf16.data(), DType::kBF16, c.m, c.k, x8.data_as<uint8_t>(), x_scales.data_as<float>(), nullptr);
    tessel::cuda::launch_quantize_rows_fp8(w_bf16.data(), DType::kBF16, c.n, c.k, w8.data_as<uint8_t>(), w_scales.data_as<float>(), nullptr);
    const Tensor b = c.output == DType::kBF16 ? device_copy(to_bf16_bits(bias), DType::kBF16) : device_copy(bias, DType::kF32);
    const size_t out_bytes = static_cast<size_t>(c.m * c.n) * dtype_size(c.output);
    Tensor y = Tensor::empty({static_cast<int64_t>(out_bytes)}, DType::kU8, Device::cuda());
    ASSERT_EQ(cudaMemset(y.data(), 0xff, out_bytes), cudaSuccess);  // poisoned: NaN in bf16 and fp32

    GemmShape shape{c.m, c.n, c.k, DType::kBF16, c.output, c.epilogue};
    shape.fp8_row_scaled = true;
    gemm.linear_fp8(shape, x8.data_as<uint8_t>(), x_scales.data_as<float>(), w8.data_as<uint8_t>(), w_scales.data_as<float>(),
                    with_bias ? b.data() : nullptr, y.data(), workspace.data(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> got;
    if (c.output == DType::kBF16) {
      std::vector<uint16_t> bits(static_cast<size_t>(c.m * c.n));
      ASSERT_EQ(cudaMemcpy(bits.data(), y.data(), out_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      got = from_bf16_bits(bits);
    } else {
      got.resize(static_cast<size_t>(c.m * c.n));
      ASSERT_EQ(cudaMemcpy(got.data(), y.data(), out_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    bool finite = true;
    for (float v : got) finite = finite && std::isfinite(v);
    EXPECT_TRUE(finite) << "a NaN or inf (the poison) survived";

    const std::vector<float>* bias_used = with_bias ? &bias : nullptr;
    const std::vector<float> exact_on_quantised =
        reference_linear(dequantized(xq, xs, c.k), dequantized(wq, ws, c.k), bias_used, c.m, c.k, c.n, gelu);
    const std::vector<float> unquantised = reference_linear(x, w, bias_used, c.m, c.k, c.n, gelu);
    const double gemm_error = rel_l2(got, exact_on_quantised);
    const double quantisation_error = rel_l2(got, unquantised, c.n, c.outliers ? ordinary : std::vector<bool>{});
    std::printf("[fp8 GEMM %s] scales in %s, bias/GELU in %s; rel-L2 vs fp32 of the dequantised operands %.3e; vs the "
                "unquantised (bf16) operands %.3e%s\n",
                describe(c).c_str(), gemm.fp8_scales_in_cublaslt(shape) ? "cuBLASLt" : "ours",
                gemm.fused_epilogue(shape) ? "cuBLASLt" : "ours", gemm_error, quantisation_error,
                c.outliers ? " (ordinary channels)" : "");
    EXPECT_LE(gemm_error, 4e-3);
    EXPECT_LE(quantisation_error, 0.07);
    EXPECT_GE(quantisation_error, 5e-3);
    if (c.outliers) {
      // What one scale per tensor would do to the ordinary channels (host emulation, printed only).
      float wmax = 0.f, xmax = 0.f;
      for (float v : w) wmax = std::max(wmax, std::fabs(v));
      for (float v : x) xmax = std::max(xmax, std::fabs(v));
      std::vector<float> wt(w.size()), xt(x.size());
      for (size_t i = 0; i < w.size(); ++i) wt[i] = e4m3_value(__nv_cvt_float_to_fp8(w[i] * (448.f / wmax), __NV_SATFINITE, __NV_E4M3)) * (wmax / 448.f);
      for (size_t i = 0; i < x.size(); ++i) xt[i] = e4m3_value(__nv_cvt_float_to_fp8(x[i] * (448.f / xmax), __NV_SATFINITE, __NV_E4M3)) * (xmax / 448.f);
      const double per_tensor = rel_l2(reference_linear(xt, wt, bias_used, c.m, c.k, c.n, gelu), unquantised, c.n, ordinary);
      std::printf("[fp8 GEMM %s] per-tensor scales would give %.3e on the ordinary channels\n", describe(c).c_str(), per_tensor);
    }
  }
  }
  EXPECT_FALSE(own_scaling.fp8_scales_in_cublaslt(GemmShape{16, 64, 64, DType::kBF16, DType::kBF16, GemmEpilogue::kBias, true}));
}

TEST(Fp8Linear, RefusesMisalignedShapesAndPlainShapesClearly) {
  SKIP_WITHOUT_FP8_GPU();
  const CublasLtGemm gemm;
  GemmShape shape{4, 40, 64, DType::kBF16, DType::kBF16, GemmEpilogue::kBias};
  shape.fp8_row_scaled = true;
  try {
    gemm.linear_fp8(shape, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    ADD_FAILURE() << "n 40 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 16"), std::string::npos) << e.what();
  }
  shape.n = 48;
  shape.output = DType::kF32;
  try {
    gemm.linear_fp8(shape, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    ADD_FAILURE() << "fp32 output accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
  shape.output = DType::kBF16;
  shape.fp8_row_scaled = false;
  try {
    gemm.linear_fp8(shape, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    ADD_FAILURE() << "a plain shape accepted by linear_fp8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8_row_scaled"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel
#endif  // TESSEL_WITH_CUDA
