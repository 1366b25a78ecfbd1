#include "device_memory.h"

#include "tessel/core/allocator.h"
#include "tessel/core/error.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>
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

std::shared_ptr<void> hold_device_memory_beyond(Device device, size_t limit_bytes, const std::string& flag) {
  const std::optional<DeviceMemory> memory = device_memory(device);
  if (!memory) fail_argument(flag, "--device cuda[:N] (a device memory limit)", device.str());
  if (limit_bytes >= memory->total)
    fail_argument(flag, detail::concat("below the device's ", memory->total / double(1 << 30), " GiB"), limit_bytes / double(1 << 30));
  const size_t held = memory->total - limit_bytes, free_bytes = memory->total - memory->used;
  if (held > free_bytes)
    fail_argument(flag, detail::concat("at least ", memory->used / double(1 << 30), " GiB (in use on ", device.str(), " already)"),
                  limit_bytes / double(1 << 30));
  return allocate(held, MemoryKind::kDevice, device.index);
}

}  // namespace tessel::cli
