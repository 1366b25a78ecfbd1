#include "cuda/vector_ops.h"

#include "cuda/grid_stride.h"

namespace tessel::diffusion::cuda {
namespace {

__global__ void add_into_kernel(float* x, const float* y, int64_t count) {
  TESSEL_GRID_STRIDE(i, count) x[i] = __fadd_rn(x[i], y[i]);
}

__global__ void difference_kernel(const float* a, const float* b, float* out, int64_t count) {
  TESSEL_GRID_STRIDE(i, count) out[i] = __fsub_rn(a[i], b[i]);
}

__global__ void cfg_guidance_kernel(const float* cond, const float* uncond, float scale, float* out, int64_t count) {
  TESSEL_GRID_STRIDE(i, count) out[i] = __fadd_rn(uncond[i], __fmul_rn(scale, __fsub_rn(cond[i], uncond[i])));
}

}  // namespace

void launch_add_into(float* x, const float* y, int64_t count, cudaStream_t stream) {
  if (count > 0) add_into_kernel<<<grid_blocks(count), kGridThreads, 0, stream>>>(x, y, count);
}

void launch_difference(const float* a, const float* b, float* out, int64_t count, cudaStream_t stream) {
  if (count > 0) difference_kernel<<<grid_blocks(count), kGridThreads, 0, stream>>>(a, b, out, count);
}

void launch_cfg_guidance(const float* cond, const float* uncond, float scale, float* out, int64_t count, cudaStream_t stream) {
  if (count > 0) cfg_guidance_kernel<<<grid_blocks(count), kGridThreads, 0, stream>>>(cond, uncond, scale, out, count);
}

}  // namespace tessel::diffusion::cuda
