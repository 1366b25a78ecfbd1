// Element-wise fp32 vector operations on the device (internal to the diffusion layer's CUDA code).
// Each enqueues on `stream` and never synchronizes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tessel::diffusion::cuda {

// x += y.
void launch_add_into(float* x, const float* y, int64_t count, cudaStream_t stream);
// out = a - b.
void launch_difference(const float* a, const float* b, float* out, int64_t count, cudaStream_t stream);
// out = uncond + scale * (cond - uncond), each operation rounded on its own (no fused multiply-add)
// as the CPU loop computes it.
void launch_cfg_guidance(const float* cond, const float* uncond, float scale, float* out, int64_t count, cudaStream_t stream);

}  // namespace tessel::diffusion::cuda
