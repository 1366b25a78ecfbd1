#include "cuda/hopper/device_support.h"

#include <cuda_runtime.h>

#include <mutex>
#include <optional>
#include <vector>

namespace tessel::cuda::detail {

HopperDevice current_hopper_device() {
  static std::mutex mutex;
  static std::vector<std::optional<HopperDevice>> known;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return {};
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(known.size()) <= device) known.resize(static_cast<size_t>(device) + 1);
  std::optional<HopperDevice>& facts = known[static_cast<size_t>(device)];
  if (!facts) {
    int major = 0, minor = 0, sms = 0;
    const bool read = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
                      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess;
#if defined(TESSEL_CUDA_SM90A)
    const bool sm90a_code = true;
#else
    const bool sm90a_code = false;
#endif
    facts = HopperDevice{read && sm90a_code && major == 9 && minor == 0, sms};
  }
  return *facts;
}

}  // namespace tessel::cuda::detail
