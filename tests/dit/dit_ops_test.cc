// The dit ops against float64 formulas on shapes that hit every edge of their loops (the GEMM's
// partial row and column tiles and its k chunks; batches with their own modulation vectors).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tessel/dit/ops.h"
#include "tessel/core/random.h"

namespace tessel::dit {
namespace {

std::vector<float> random_floats(int64_t count, uint64_t seed) {
  std::vector<float> values(static_cast<size_t>(count));
  fill_normal(TensorView(values.data(), DType::kF32, Device::cpu(), {count}), seed);
  return values;
}

// Largest |actual - expected| relative to the largest |expected|.
double max_rel_error(const std::vector<float>& actual, const std::vector<double>& expected) {
  double error = 0.0, scale = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    error = std::max(error, std::abs(actual[i] - expected[i]));
    scale = std::max(scale, std::abs(expected[i]));
  }
  return error / scale;
}

ExecContext two_threads() {
  ExecContext ctx;
  ctx.num_threads = 2;
  return ctx;
}

TEST(DitOps, LinearMatchesFloat64OnPartialTilesAndSeveralKChunks) {
  for (const auto& [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{7, 300, 37}, {4, 16, 16}, {1, 1, 1}, {9, 520, 33}}) {
    const auto x = random_floats(m * k, 1), w_t = random_floats(k * n, 2), bias = random_floats(n, 3);
    std::vector<float> y(static_cast<size_t>(m * n), std::nanf(""));
    linear(two_threads(), x.data(), m, k, w_t.data(), bias.data(), n, y.data());
    std::vector<double> expected(static_cast<size_t>(m * n));
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        double sum = bias[c];
        for (int64_t i = 0; i < k; ++i) sum += static_cast<double>(x[r * k + i]) * w_t[i * n + c];
        expected[r * n + c] = sum;
      }
    EXPECT_LE(max_rel_error(y, expected), 1e-5) << m << " x " << k << " x " << n;
  }
}

TEST(DitOps, AdaLayerNormUsesEachBatchsShiftAndScale) {
  const int64_t batch = 2, rows = 3, dim = 40;
  const auto x = random_floats(batch * rows * dim, 4), modulation = random_floats(batch * 3 * dim, 5);
  std::vector<float> y(x.size());
  // shift at offset 0 and scale at offset dim of each batch's 3 * dim vector.
  layer_norm_modulate(two_threads(), x.data(), batch, rows, dim, 1e-6, modulation.data(), modulation.data() + dim, 3 * dim, y.data());
  std::vector<double> expected(x.size());
  for (int64_t r = 0; r < batch * rows; ++r) {
    const float* in = x.data() + r * dim;
    const float* shift = modulation.data() + (r / rows) * 3 * dim;
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < dim; ++i) mean += in[i] / static_cast<double>(dim);
    for (int64_t i = 0; i < dim; ++i) var += (in[i] - mean) * (in[i] - mean) / static_cast<double>(dim);
    for (int64_t i = 0; i < dim; ++i)
      expected[r * dim + i] = (in[i] - mean) / std::sqrt(var + 1e-6) * (1.0 + shift[dim + i]) + shift[i];
  }
  EXPECT_LE(max_rel_error(y, expected), 1e-6);
}

TEST(DitOps, RmsNormRotaryPairsAndGeluMatchTheirFormulas) {
  const int64_t rows = 3, heads = 2, head_dim = 6, dim = heads * head_dim;
  auto x = random_floats(rows * dim, 6);
  const auto weight = random_floats(dim, 7);
  const std::vector<float> input = x;
  rms_norm(two_threads(), x.data(), rows, dim, 1e-6, weight.data());
  std::vector<double> expected(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean_square = 0.0;
    for (int64_t i = 0; i < dim; ++i) mean_square += static_cast<double>(input[r * dim + i]) * input[r * dim + i] / dim;
    for (int64_t i = 0; i < dim; ++i) expected[r * dim + i] = input[r * dim + i] / std::sqrt(mean_square + 1e-6) * weight[i];
  }
  EXPECT_LE(max_rel_error(x, expected), 1e-6);

  // Token s, pair i rotates by angle 0.3 * (s + 1) * (i + 1).
  std::vector<float> cos(static_cast<size_t>(rows * head_dim / 2)), sin(cos.size());
  for (int64_t s = 0; s < rows; ++s)
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      cos[s * head_dim / 2 + i] = static_cast<float>(std::cos(0.3 * (s + 1) * (i + 1)));
      sin[s * head_dim / 2 + i] = static_cast<float>(std::sin(0.3 * (s + 1) * (i + 1)));
    }
  std::vector<float> rotated = input;
  rotate_pairs(two_threads(), rotated.data(), 1, rows, heads, head_dim, cos.data(), sin.data());
  for (int64_t s = 0; s < rows; ++s)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < head_dim / 2; ++i) {
        const int64_t at = (s * heads + h) * head_dim + 2 * i;
        const double angle = 0.3 * (s + 1) * (i + 1);
        expected[at] = input[at] * std::cos(angle) - input[at + 1] * std::sin(angle);
        expected[at + 1] = input[at] * std::sin(angle) + input[at + 1] * std::cos(angle);
      }
  EXPECT_LE(max_rel_error(rotated, expected), 1e-6);

  std::vector<float> activated = input;
  gelu_tanh(two_threads(), activated.data(), static_cast<int64_t>(activated.size()));
  for (size_t i = 0; i < input.size(); ++i) {
    const double v = input[i];
    expected[i] = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
  }
  EXPECT_LE(max_rel_error(activated, expected), 1e-6);
}

TEST(DitOps, SinusoidalEmbeddingPutsCosinesFirst) {
  const float t[2] = {0.0f, 500.0f};
  std::vector<float> out(2 * 8);
  sinusoidal_embedding(t, 2, 8, out.data());
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(out[i], 1.0f);      // cos(0)
    EXPECT_FLOAT_EQ(out[4 + i], 0.0f);  // sin(0)
    const double frequency = std::exp(-std::log(10000.0) * i / 4.0);
    EXPECT_NEAR(out[8 + i], std::cos(500.0 * frequency), 1e-5);
    EXPECT_NEAR(out[12 + i], std::sin(500.0 * frequency), 1e-5);
  }
}

}  // namespace
}  // namespace tessel::dit
