// head_error_sums on the CPU against sums taken in another order in long double, on random
// outputs of odd shapes, and its argument checks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "tessel/kernels/head_error_sums.h"

namespace tessel {
namespace {

// Σ over (b, s, d) per head, visiting the elements in storage order (all heads interleaved).
HeadErrorSums reference_sums(const Tensor& approx, const Tensor& reference) {
  const int64_t heads = reference.size(2), dim = reference.size(3);
  std::vector<long double> diff(heads), ref(heads), app(heads), dot(heads);
  const float* a = approx.data_as<const float>();
  const float* r = reference.data_as<const float>();
  for (int64_t i = 0; i < reference.numel(); ++i) {
    const int64_t h = (i / dim) % heads;
    const long double x = a[i], y = r[i];
    diff[h] += (x - y) * (x - y), ref[h] += y * y, app[h] += x * x, dot[h] += x * y;
  }
  HeadErrorSums s;
  for (int64_t h = 0; h < heads; ++h) {
    s.diff.push_back(static_cast<double>(diff[h]));
    s.reference.push_back(static_cast<double>(ref[h]));
    s.approx.push_back(static_cast<double>(app[h]));
    s.dot.push_back(static_cast<double>(dot[h]));
  }
  return s;
}

void expect_sums_near(const HeadErrorSums& got, const HeadErrorSums& want, double relative) {
  ASSERT_EQ(got.diff.size(), want.diff.size());
  for (size_t h = 0; h < want.diff.size(); ++h) {
    SCOPED_TRACE(::testing::Message() << "head " << h);
    EXPECT_NEAR(got.diff[h], want.diff[h], relative * want.diff[h]);
    EXPECT_NEAR(got.reference[h], want.reference[h], relative * want.reference[h]);
    EXPECT_NEAR(got.approx[h], want.approx[h], relative * want.approx[h]);
    EXPECT_NEAR(got.dot[h], want.dot[h], relative * std::abs(want.dot[h]) + 1e-9);
  }
}

TEST(HeadErrorSums, MatchesLongDoubleSumsOnOddShapes) {
  const Shape shapes[] = {{2, 37, 3, 13}, {1, 129, 5, 64}, {3, 1, 1, 7}};
  uint64_t seed = 11;
  for (const Shape& shape : shapes) {
    Tensor reference = Tensor::empty(shape, DType::kF32), noise = Tensor::empty(shape, DType::kF32);
    fill_normal(reference.view(), seed++);
    fill_normal(noise.view(), seed++, 0.0, 0.1);
    Tensor approx = Tensor::empty(shape, DType::kF32);
    float* a = approx.data_as<float>();
    for (int64_t i = 0; i < approx.numel(); ++i) a[i] = reference.data_as<const float>()[i] + noise.data_as<const float>()[i];
    expect_sums_near(head_error_sums(ExecContext{}, approx.view(), reference.view()), reference_sums(approx, reference), 1e-12);
  }
}

TEST(HeadErrorSums, EqualOutputsHaveZeroDifferenceAndFullCosine) {
  Tensor x = Tensor::empty({1, 20, 2, 9}, DType::kF32);
  fill_normal(x.view(), 5);
  const HeadErrorSums s = head_error_sums(ExecContext{}, x.view(), x.view());
  for (size_t h = 0; h < 2; ++h) {
    EXPECT_EQ(s.diff[h], 0.0);
    EXPECT_GT(s.reference[h], 0.0);
    EXPECT_DOUBLE_EQ(s.dot[h], s.reference[h]);
    EXPECT_DOUBLE_EQ(s.approx[h], s.reference[h]);
  }
}

void expect_error_naming(const TensorView& approx, const TensorView& reference, const std::string& name) {
  try {
    head_error_sums(ExecContext{}, approx, reference);
    ADD_FAILURE() << "expected tessel::Error naming " << name;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(HeadErrorSums, RejectsMismatchedOrUnsupportedOperands) {
  Tensor a = Tensor::zeros({1, 8, 2, 4}, DType::kF32);
  Tensor other_shape = Tensor::zeros({1, 8, 3, 4}, DType::kF32);
  Tensor bf16 = Tensor::zeros({1, 8, 2, 4}, DType::kBF16);
  Tensor rank3 = Tensor::zeros({8, 2, 4}, DType::kF32);
  expect_error_naming(a.view(), other_shape.view(), "reference");
  expect_error_naming(bf16.view(), a.view(), "approx");
  expect_error_naming(a.view(), rank3.view(), "reference");
}

}  // namespace
}  // namespace tessel
