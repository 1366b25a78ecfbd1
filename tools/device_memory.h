// What a CUDA device's memory holds, as the driver reports it (for benchmark reports), without the
// benchmark naming a device API.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "tessel/core/device.h"

namespace tessel::cli {

struct DeviceMemory {
  size_t used = 0;   // bytes in use on the device, by every process and context
  size_t total = 0;
};

// The memory of `device`; nullopt for the CPU or in a build without CUDA.
std::optional<DeviceMemory> device_memory(Device device);

// Holds all of `device`'s memory but `limit_bytes` (as cudaMemGetInfo counts it, the context
// included) until the handle is dropped, so that what runs meanwhile sees a card of that size
// (block offload's small-card benchmark). `flag` names the option in errors: a limit not below the
// device's total, or one the free memory cannot make (other processes hold it), is an Error.
std::shared_ptr<void> hold_device_memory_beyond(Device device, size_t limit_bytes, const std::string& flag);

}  // namespace tessel::cli
