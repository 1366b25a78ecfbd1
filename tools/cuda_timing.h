// CUDA-event timing for `tessel bench --device cuda` (its own file so the bench command stays
// device-agnostic). Compiled in every build; without CUDA the functions throw tessel::Error.
#pragma once

#include <functional>
#include <string>

namespace tessel::cli {

struct CudaTiming {
  double median_ms = 0.0;
  double min_ms = 0.0;
  int reps = 0;
};

// Runs `launch` (which enqueues device work on tessel's current CUDA stream) `warmup` times,
// then times each of `reps` runs between two CUDA events and reports the median and minimum.
CudaTiming time_cuda(const std::function<void()>& launch, int warmup, int reps);

// "NVIDIA H100 80GB HBM3, driver 580.159.04, CUDA runtime 13.0" (or why it is unknown).
std::string cuda_device_summary();

}  // namespace tessel::cli
