// The host residuals of a step cache (see branch_residuals.h).
#include "branch_residuals.h"

#include <array>
#include <vector>

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
  void clear() override { residuals_ = {}; }
  Device device() const override { return Device::cpu(); }

 private:
  std::array<std::vector<float>, 2> residuals_;
};

}  // namespace

std::unique_ptr<BranchResiduals> make_host_residuals() { return std::make_unique<HostResiduals>(); }

}  // namespace tessel
