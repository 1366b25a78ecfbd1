// The device estimators with one selection value per query head (options.per_head,
// per_head_threshold): each head's rows are exactly those of an estimate with that head's value for
// every head, on random q/k with GQA and sequences that are not block multiples; and the per-head
// arguments are checked. Skips (with a message) when no GPU is present.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "tessel/sparse/estimators/device_mask_estimation.h"

namespace tessel {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

Tensor random_bf16_on_gpu(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  fill_normal(t.view(), seed);
  return t.to(DType::kBF16).to(Device::cuda());
}

constexpr int64_t kSeq = 1111, kHeads = 4, kKvHeads = 2, kDim = 64;

// Every row of head h of `mask` equals that row of `single` (estimated with head h's value for all).
void expect_head_rows_equal(const BlockMask& mask, const BlockMask& single, int64_t head) {
  for (int64_t r = 0; r < mask.shape().q_blocks(); ++r)
    EXPECT_EQ(mask.row(0, head, r), single.row(0, head, r)) << "head " << head << ", q block " << r;
}

TEST(PerHeadEstimateGpu, TopkRowsEqualTheEstimateWithEachHeadsValue) {
  SKIP_WITHOUT_GPU();
  const Tensor q = random_bf16_on_gpu({1, kSeq, kHeads, kDim}, 1), k = random_bf16_on_gpu({1, kSeq, kKvHeads, kDim}, 2);
  const BlockMaskShape shape{1, kHeads, kSeq, kSeq, 128, 64};
  for (const bool cdf_mode : {false, true}) {
    SCOPED_TRACE(cdf_mode ? "cdf mode" : "top-k mode");
    TopkEstimatorOptions o;
    o.similarity_threshold = -2.0;  // rank every block of the random inputs
    o.per_head = cdf_mode ? std::vector<double>{0.3, 0.9, 0.6, 0.75} : std::vector<double>{0.1, 0.5, 0.25, 0.9};
    if (cdf_mode) o.cdf_threshold = 1.0;
    DeviceEstimatedMask per_head(shape, kKvHeads, kDim, Device::cuda());
    estimate_topk_mask_device(ExecContext{}, q, k, o, per_head);
    const BlockMask mask = per_head.to_host();
    EXPECT_EQ(per_head.kept_blocks(nullptr), mask.nnz());
    for (int64_t h = 0; h < kHeads; ++h) {
      TopkEstimatorOptions one = o;
      one.per_head.clear();
      if (cdf_mode) one.cdf_threshold = o.per_head[h];
      else one.topk_ratio = o.per_head[h];
      DeviceEstimatedMask single(shape, kKvHeads, kDim, Device::cuda());
      estimate_topk_mask_device(ExecContext{}, q, k, one, single);
      expect_head_rows_equal(mask, single.to_host(), h);
    }
  }
}

TEST(PerHeadEstimateGpu, ThresholdRowsEqualTheEstimateWithEachHeadsValue) {
  SKIP_WITHOUT_GPU();
  const Tensor q = random_bf16_on_gpu({1, kSeq, kHeads, kDim}, 3), k = random_bf16_on_gpu({1, kSeq, kKvHeads, kDim}, 4);
  const BlockMaskShape shape{1, kHeads, kSeq, kSeq, 128, 64};
  XAttentionOptions o;
  o.per_head_threshold = {0.5, 0.95, 0.8, 0.65};
  DeviceEstimatedMask per_head(shape, kKvHeads, kDim, Device::cuda(), o.stride);
  estimate_xattention_mask_device(ExecContext{}, q, k, o, per_head);
  const BlockMask mask = per_head.to_host();
  EXPECT_GT(mask.density(), 0.0);
  EXPECT_LT(mask.density(), 1.0);
  for (int64_t h = 0; h < kHeads; ++h) {
    XAttentionOptions one = o;
    one.per_head_threshold.clear();
    one.threshold = o.per_head_threshold[h];
    DeviceEstimatedMask single(shape, kKvHeads, kDim, Device::cuda(), o.stride);
    estimate_xattention_mask_device(ExecContext{}, q, k, one, single);
    expect_head_rows_equal(mask, single.to_host(), h);
  }
}

void expect_error_naming(const std::function<void()>& call, const std::string& name) {
  try {
    call();
    ADD_FAILURE() << "expected tessel::Error naming " << name;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(PerHeadEstimateGpu, RejectsPerHeadValuesOfTheWrongCountOrRange) {
  SKIP_WITHOUT_GPU();
  const Tensor q = random_bf16_on_gpu({1, 256, kHeads, kDim}, 5), k = random_bf16_on_gpu({1, 256, kKvHeads, kDim}, 6);
  DeviceEstimatedMask mask({1, kHeads, 256, 256, 128, 64}, kKvHeads, kDim, Device::cuda());
  TopkEstimatorOptions short_list;
  short_list.per_head = {0.5, 0.5};
  expect_error_naming([&] { estimate_topk_mask_device(ExecContext{}, q, k, short_list, mask); }, "topk.per_head");
  XAttentionOptions zero;
  zero.per_head_threshold = {0.5, 0.0, 0.5, 0.5};
  expect_error_naming([&] { estimate_xattention_mask_device(ExecContext{}, q, k, zero, mask); },
                      "xattention.per_head_threshold[1]");
}

}  // namespace
}  // namespace tessel
