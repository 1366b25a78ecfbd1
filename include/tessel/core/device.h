// Where a tensor's memory lives.
#pragma once

#include <string>
#include <string_view>

namespace tessel {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::kCUDA, index}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu" or "cuda:0"
};

Device parse_device(std::string_view name);  // "cpu", "cuda", "cuda:N"; throws Error

// True when tessel was built with CUDA and at least one GPU is visible at run time.
bool cuda_available();
// The GPUs visible at run time (0 without CUDA, a driver or a GPU).
int cuda_device_count();
// True when tessel was built with CUDA support compiled in (whether or not a GPU is present).
bool cuda_compiled();

}  // namespace tessel
