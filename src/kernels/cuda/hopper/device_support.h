// Whether the Hopper-only kernels (wgmma, setmaxnreg: sm_90a) can run on the current device.
#pragma once

namespace tessel::cuda::detail {

struct HopperDevice {
  bool supported = false;  // compute capability 9.0 and this build carries sm_90a code
  int multiprocessors = 0;
};

// The current device's facts, read once per device (attribute queries are not stream work: safe
// during graph capture).
HopperDevice current_hopper_device();

}  // namespace tessel::cuda::detail
