// The device form of make_mask_estimating_backend as far as a machine without a GPU can check it:
// CPU tensors keep using the host estimator (the device estimator is never called), and the
// argument errors. The CUDA path itself is tested in dynamic_backends_gpu_test.cc.
#include <gtest/gtest.h>

#include "sparse/pattern_test_util.h"
#include "sparse/sparse_test_util.h"
#include "tessel/core/error.h"
#include "tessel/sparse/mask_planning.h"

namespace tessel {
namespace {

using namespace tessel::testing;

PatternBackendInfo info_for(const std::string& name) {
  PatternBackendInfo info;
  info.name = name;
  info.patterns = {PatternType::kDynamicTopk};
  return info;
}

// Keeps the first kv block of every row.
BlockMask first_block(const ExecContext&, const TensorView&, const TensorView&, const PatternSpec& spec, const StepInfo&,
                      const AttentionShape& shape) {
  BlockMaskShape s;
  s.seq_q = shape.seq_q;
  s.seq_kv = shape.seq_kv;
  s.block_q = spec.block_q;
  s.block_kv = spec.block_kv;
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(s.q_blocks()), std::vector<int32_t>{0});
  return BlockMask::from_rows(s, rows);
}

TEST(DeviceEstimatorBackend, CpuTensorsUseTheHostEstimator) {
  int device_checks = 0, device_estimates = 0;
  DeviceMaskEstimator device{[&](const PatternSpec&, const AttentionShape&) { ++device_checks; },
                             [&](const ExecContext&, const TensorView&, const TensorView&, const PatternSpec&,
                                 const StepInfo&, DeviceEstimatedMask&) {
                               ++device_estimates;
                             }};
  const auto backend = make_mask_estimating_backend(info_for("first_block"), first_block, device);
  PatternSpec spec;
  spec.type = PatternType::kDynamicTopk;
  spec.topk_ratio = 0.5;
  spec.block_q = spec.block_kv = 32;
  const Qkv t = random_qkv(1, 96, 128, 2, 1, 16, DType::kF32, 9);
  const auto metadata = backend->make_metadata_builder()->plan(ExecContext{}, spec, ModuleType::kDitSelf, AttentionShape::of(t.q, t.k, t.v));
  Tensor out = poisoned(t.q.shape(), DType::kF32);
  Tensor lse = poisoned({1, 2, 96}, DType::kF32);
  const ForwardStats stats = backend->make_impl()->forward(ExecContext{}, t.q, t.k, t.v, *metadata, StepInfo{}, out, lse);
  EXPECT_EQ(device_checks, 0);
  EXPECT_EQ(device_estimates, 0);
  EXPECT_DOUBLE_EQ(stats.density, 0.25);  // one of four kv blocks
  expect_matches_masked_reference(t, first_block(ExecContext{}, t.q, t.k, spec, StepInfo{}, AttentionShape::of(t.q, t.k, t.v)), out, lse);
  expect_error([&] { device_estimated_mask(*metadata); }, "a CUDA plan");
}

TEST(DeviceEstimatorBackend, AnEmptyDeviceEstimateIsAnError) {
  expect_error([] { make_mask_estimating_backend(info_for("no_device"), first_block, DeviceMaskEstimator{}); },
               "device estimator of 'no_device'");
}

}  // namespace
}  // namespace tessel
