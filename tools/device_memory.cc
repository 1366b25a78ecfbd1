#include "device_memory.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>

#include "tessel/core/error.h"
#endif

namespace tessel::cli {

std::optional<DeviceMemory> device_memory(Device device) {
#ifdef TESSEL_WITH_CUDA
  if (!device.is_cuda()) return std::nullopt;
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device.index);
  size_t free_bytes = 0, total_bytes = 0;
  const cudaError_t status = cudaMemGetInfo(&free_bytes, &total_bytes);
  cudaSetDevice(previous);
  if (status != cudaSuccess) throw Error(detail::concat("cudaMemGetInfo on ", device.str(), ": ", cudaGetErrorString(status)));
  return DeviceMemory{total_bytes - free_bytes, total_bytes};
#else
  (void)device;
  return std::nullopt;
#endif
}

}  // namespace tessel::cli
