#include "tessel/core/device.h"

#include <string>

#include "tessel/core/error.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace tessel {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device parse_device(std::string_view name) {
  if (name == "cpu") return Device::cpu();
  if (name == "cuda") return Device::cuda(0);
  if (name.substr(0, 5) == "cuda:") {
    const std::string digits(name.substr(5));
    // At most 4 digits: a longer index is no device and would overflow the conversion.
    if (!digits.empty() && digits.size() <= 4 && digits.find_first_not_of("0123456789") == std::string::npos)
      return Device::cuda(std::stoi(digits));
  }
  fail_argument("device", "cpu, cuda or cuda:N", std::string(name));
}

bool cuda_compiled() {
#ifdef TESSEL_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef TESSEL_WITH_CUDA
  static const int count = [] {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no driver/no device" error
      return 0;
    }
    return devices;
  }();
  return count;
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

}  // namespace tessel
