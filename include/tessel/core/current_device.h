// The calling thread's current CUDA device. CUDA launches kernels, creates streams and NCCL
// communicators on the current device, not on the device a tensor names: a process that computes
// on one GPU other than GPU 0 (a rank of a parallel group) makes that GPU current once, before any
// work, so that its kernels run where its memory is.
#pragma once

#include "tessel/core/device.h"

namespace tessel {

// cudaSetDevice(device.index) for a CUDA device; nothing for the CPU. Throws Error naming the
// device when CUDA refuses (no such GPU, or tessel built without CUDA).
void make_current_device(Device device);

}  // namespace tessel
