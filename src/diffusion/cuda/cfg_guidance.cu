#include "cuda/cfg_guidance.h"

#include <algorithm>

namespace tessel::diffusion::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void cfg_guidance_kernel(const float* __restrict__ cond, const float* __restrict__ uncond, float scale,
                                    float* __restrict__ out, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __fadd_rn(uncond[i], __fmul_rn(scale, __fsub_rn(cond[i], uncond[i])));
}

}  // namespace

void launch_cfg_guidance(const float* cond, const float* uncond, float scale, float* out, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  constexpr int64_t kMaxBlocks = 65535;
  const int64_t blocks = std::min<int64_t>((count + kThreads - 1) / kThreads, kMaxBlocks);
  cfg_guidance_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(cond, uncond, scale, out, count);
}

}  // namespace tessel::diffusion::cuda
