// The host residuals of a step cache, and the choice by device (see branch_residuals.h).
#include "branch_residuals.h"

#include <array>
#include <cmath>
#include <vector>

#include "tessel/core/error.h"

namespace tessel {
namespace {

class HostResiduals final : public BranchResiduals {
 public:
  bool has(size_t branch, size_t count) const override { return residuals_[branch].size() == count; }
  void add_to(size_t branch, float* hidden, size_t count, StreamHandle) override {
    const std::vector<float>& residual = residuals_[branch];
    for (size_t i = 0; i < count; ++i) hidden[i] += residual[i];
  }
  void store(size_t branch, const float* blocks_input, const float* hidden, size_t count, StreamHandle) override {
    std::vector<float>& residual = residuals_[branch];
    residual.resize(count);
    for (size_t i = 0; i < count; ++i) residual[i] = hidden[i] - blocks_input[i];
  }
  L1Change l1_change(size_t branch, const float* blocks_input, const float* hidden, size_t count, StreamHandle) override {
    const std::vector<float>& residual = residuals_[branch];
    L1Change sums;
    for (size_t i = 0; i < count; ++i) {
      const double kept = residual[i];
      const float fresh = hidden[i] - blocks_input[i];
      sums.change += std::abs(kept - static_cast<double>(fresh));
      sums.magnitude += std::abs(kept);
    }
    return sums;
  }
  void clear() override { residuals_ = {}; }
  Device device() const override { return Device::cpu(); }

 private:
  std::array<std::vector<float>, 2> residuals_;
};

}  // namespace

std::unique_ptr<BranchResiduals> make_host_residuals() { return std::make_unique<HostResiduals>(); }

std::unique_ptr<BranchResiduals> make_branch_residuals(Device device, std::string_view cache) {
#ifdef TESSEL_WITH_CUDA
  if (device.is_cuda()) return make_cuda_residuals(device);
#endif
  if (!device.is_cpu())
    fail_argument(detail::concat(cache, " hidden states device"), "cpu (tessel was built without CUDA)", device.str());
  return make_host_residuals();
}

}  // namespace tessel
