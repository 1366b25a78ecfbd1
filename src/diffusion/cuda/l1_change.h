// The relative-change sums of a step cache's decision on the device (internal to the diffusion
// layer's CUDA code): DBCache compares the residual of the leading blocks with the one it kept.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tessel::diffusion::cuda {

// Per-block partial sums launch_l1_change_sums leaves in `partials` (2 * kL1ChangeBlocks doubles).
constexpr int kL1ChangeBlocks = 512;

// sums[0] = sum |kept[i] - (a[i] - b[i])|, sums[1] = sum |kept[i]| over [0, count), accumulated in
// double (a[i] - b[i] rounded to fp32 first, as the residual a cache stores). A fixed grid, a fixed
// stride per thread and fixed-order trees: the same inputs give the same bits on every run (no
// atomics). `sums`: 2 doubles of device memory. Enqueues on `stream` and never synchronizes.
void launch_l1_change_sums(const float* kept, const float* a, const float* b, int64_t count, double* partials, double* sums,
                           cudaStream_t stream);

}  // namespace tessel::diffusion::cuda
