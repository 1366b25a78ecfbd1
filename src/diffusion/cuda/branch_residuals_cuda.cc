// The device residuals of a step cache (see branch_residuals.h).
#include <array>

#include "branch_residuals.h"
#include "cuda/l1_change.h"
#include "cuda/vector_ops.h"
#include "tessel/core/allocator.h"
#include "tessel/core/error.h"
#include "tessel/kernels/cuda/device_guard.h"
#include "tessel/kernels/cuda/launch_check.h"

namespace tessel {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(detail::concat("step cache: ", what, ": ", cudaGetErrorString(status)));
}

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
  L1Change l1_change(size_t branch, const float* blocks_input, const float* hidden, size_t count, StreamHandle stream) override {
    const tessel::cuda::DeviceGuard guard(device_.index);
    if (!sums_) sums_ = allocate((2 * diffusion::cuda::kL1ChangeBlocks + 2) * sizeof(double), MemoryKind::kDevice, device_.index);
    double* partials = static_cast<double*>(sums_.get());
    double* sums = partials + 2 * diffusion::cuda::kL1ChangeBlocks;
    const auto cuda_stream = static_cast<cudaStream_t>(stream);
    diffusion::cuda::launch_l1_change_sums(static_cast<const float*>(buffers_[branch].get()), hidden, blocks_input,
                                           static_cast<int64_t>(count), partials, sums, cuda_stream);
    tessel::cuda::check_launch("step cache: residual change");
    double host[2] = {0.0, 0.0};
    check_cuda(cudaMemcpyAsync(host, sums, sizeof(host), cudaMemcpyDeviceToHost, cuda_stream), "residual change download");
    check_cuda(cudaStreamSynchronize(cuda_stream), "residual change synchronization");
    return L1Change{host[0], host[1]};
  }
  void clear() override { counts_ = {}; }
  Device device() const override { return device_; }

 private:
  Device device_;
  std::array<std::shared_ptr<void>, 2> buffers_;
  std::array<size_t, 2> counts_{};
  std::shared_ptr<void> sums_;  // l1_change's partial sums, then its two totals
};

}  // namespace

std::unique_ptr<BranchResiduals> make_cuda_residuals(Device device) {
  return std::make_unique<CudaResiduals>(device);
}

}  // namespace tessel
