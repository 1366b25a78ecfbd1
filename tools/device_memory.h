// What a CUDA device's memory holds, as the driver reports it (for benchmark reports), without the
// benchmark naming a device API.
#pragma once

#include <cstddef>
#include <optional>

#include "tessel/core/device.h"

namespace tessel::cli {

struct DeviceMemory {
  size_t used = 0;   // bytes in use on the device, by every process and context
  size_t total = 0;
};

// The memory of `device`; nullopt for the CPU or in a build without CUDA.
std::optional<DeviceMemory> device_memory(Device device);

}  // namespace tessel::cli
