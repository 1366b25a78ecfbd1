// Makes a CUDA device current for a scope, then restores the previous one (CUDA builds only).
#pragma once

#include <cuda_runtime.h>

#include "tessel/core/error.h"

namespace tessel::cuda {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ == device) return;
    const cudaError_t status = cudaSetDevice(device);
    if (status != cudaSuccess)
      throw Error(tessel::detail::concat("cudaSetDevice(", device, ") failed: ", cudaGetErrorString(status)));
    restore_ = true;
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

}  // namespace tessel::cuda
