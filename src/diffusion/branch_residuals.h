// What a step cache keeps per CFG branch between forwards: the residual the transformer blocks
// added in the branch's last computed forward, in the memory of the device the hidden states live
// on (internal to the cache backends).
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "tessel/core/device.h"
#include "tessel/core/exec_context.h"

namespace tessel {

struct L1Change {
  double change = 0.0;     // sum |kept - fresh|
  double magnitude = 0.0;  // sum |kept|
};

class BranchResiduals {
 public:
  virtual ~BranchResiduals() = default;
  // True when `branch` holds a residual of `count` values.
  virtual bool has(size_t branch, size_t count) const = 0;
  // hidden[0, count) += the branch's residual. `stream`: where device work is enqueued (CUDA).
  virtual void add_to(size_t branch, float* hidden, size_t count, StreamHandle stream) = 0;
  // The branch's residual = hidden - blocks_input, over `count` values.
  virtual void store(size_t branch, const float* blocks_input, const float* hidden, size_t count, StreamHandle stream) = 0;
  // How far a fresh residual r = hidden - blocks_input (rounded to fp32, as store keeps it) lies from
  // the branch's: the sums of |residual - r| and of |residual| in double (the branch must hold
  // `count` values). A device waits for its stream: the sums decide on the host.
  virtual L1Change l1_change(size_t branch, const float* blocks_input, const float* hidden, size_t count, StreamHandle stream) = 0;
  virtual void clear() = 0;
  virtual Device device() const = 0;
};

std::unique_ptr<BranchResiduals> make_host_residuals();
#ifdef TESSEL_WITH_CUDA
// Device buffers on `device`; the updates are enqueued on the caller's stream and never wait.
std::unique_ptr<BranchResiduals> make_cuda_residuals(Device device);
#endif
// The residuals of hidden states on `device`: host vectors on the CPU, device buffers on CUDA.
// Throws Error naming `cache` (the backend) for a device this build does not run.
std::unique_ptr<BranchResiduals> make_branch_residuals(Device device, std::string_view cache);

}  // namespace tessel
