// The device residuals of a step cache (see branch_residuals.h).
#include <array>

#include "branch_residuals.h"
#include "cuda/vector_ops.h"
#include "tessel/core/allocator.h"
#include "tessel/kernels/cuda/device_guard.h"
#include "tessel/kernels/cuda/launch_check.h"

namespace tessel {
namespace {

class CudaResiduals final : public BranchResiduals {
 public:
  explicit CudaResiduals(Device device) : device_(device) {}

  bool has(size_t branch, size_t count) const override { return counts_[branch] == count; }
  void add_to(size_t branch, float* hidden, size_t count, StreamHandle stream) override {
    const tessel::cuda::DeviceGuard guard(device_.index);
    diffusion::cuda::launch_add_into(hidden, static_cast<const float*>(buffers_[branch].get()), static_cast<int64_t>(count),
                                     static_cast<cudaStream_t>(stream));
    tessel::cuda::check_launch("step cache: add the residual");
  }
  void store(size_t branch, const float* blocks_input, const float* hidden, size_t count, StreamHandle stream) override {
    const tessel::cuda::DeviceGuard guard(device_.index);
    if (counts_[branch] != count) {
      buffers_[branch] = allocate(count * sizeof(float), MemoryKind::kDevice, device_.index);
      counts_[branch] = count;
    }
    diffusion::cuda::launch_difference(hidden, blocks_input, static_cast<float*>(buffers_[branch].get()), static_cast<int64_t>(count),
                                       static_cast<cudaStream_t>(stream));
    tessel::cuda::check_launch("step cache: store the residual");
  }
  void clear() override { counts_ = {}; }
  Device device() const override { return device_; }

 private:
  Device device_;
  std::array<std::shared_ptr<void>, 2> buffers_;
  std::array<size_t, 2> counts_{};
};

}  // namespace

std::unique_ptr<BranchResiduals> make_cuda_residuals(Device device) {
  return std::make_unique<CudaResiduals>(device);
}

}  // namespace tessel
