// Block agreement of the CUDA estimators with the official SpargeAttn and XAttention estimators on
// the committed fixtures (the CPU test, estimator_parity_test.cc, asserts the same on the CPU).
// Skips (with a message) when no GPU is present.
#include <gtest/gtest.h>

#include "estimator_parity_fixtures.h"
#include "tessel/core/device.h"
#include "tessel/sparse/estimators/device_mask_estimation.h"

namespace tessel {
namespace {

using parity::Fixture;
using parity::Setting;

// The device mask of one setting, copied to the host.
BlockMask cuda_mask(const Fixture& f, const Setting& s) {
  const Device gpu = Device::cuda();
  const Tensor q = f.q.to(gpu), k = f.k.to(gpu);
  const BlockMaskShape shape{q.size(0), q.size(2), q.size(1), k.size(1), s.block_q, s.block_kv};
  DeviceEstimatedMask mask(shape, k.size(2), q.size(3), gpu);
  if (s.method == "spargeattn") estimate_topk_mask_device(ExecContext{}, q, k, parity::topk_options(s), mask);
  else estimate_xattention_mask_device(ExecContext{}, q, k, parity::xattention_options(s), mask);
  return mask.to_host();
}

TEST(EstimatorParityGpu, AgreesWithTheOfficialEstimatorsOnEveryFixture) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped";
  parity::expect_parity_on_every_fixture(cuda_mask, "on CUDA");
}

}  // namespace
}  // namespace tessel
