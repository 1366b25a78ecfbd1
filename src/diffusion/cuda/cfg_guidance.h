// Classifier-free guidance on the device (internal to the CUDA denoising loop).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tessel::diffusion::cuda {

// out[i] = uncond[i] + scale * (cond[i] - uncond[i]), fp32, each operation rounded on its own (no
// fused multiply-add) as the CPU loop computes it. Enqueued on `stream`, no synchronization.
void launch_cfg_guidance(const float* cond, const float* uncond, float scale, float* out, int64_t count, cudaStream_t stream);

}  // namespace tessel::diffusion::cuda
