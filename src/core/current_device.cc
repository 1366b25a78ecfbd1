// make_current_device of current_device.h.
#include "tessel/core/current_device.h"

#include "tessel/core/error.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace tessel {

void make_current_device(Device device) {
  if (!device.is_cuda()) return;
#ifdef TESSEL_WITH_CUDA
  const cudaError_t status = cudaSetDevice(device.index);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw Error(detail::concat("cannot make ", device.str(), " the current device: ", cudaGetErrorString(status)));
  }
#else
  fail_argument("device", "cpu (tessel was built without CUDA)", device.str());
#endif
}

}  // namespace tessel
