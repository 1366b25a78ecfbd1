#include "cuda/l1_change.h"

namespace tessel::diffusion::cuda {
namespace {

constexpr int kThreads = 256;

// Tree-reduces both sums over the block's threads in shared memory (a fixed order); thread 0 ends
// with the block's sums in change[0], magnitude[0].
__device__ void block_reduce(double change, double magnitude, double* shared_change, double* shared_magnitude) {
  shared_change[threadIdx.x] = change;
  shared_magnitude[threadIdx.x] = magnitude;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      shared_change[threadIdx.x] += shared_change[threadIdx.x + half];
      shared_magnitude[threadIdx.x] += shared_magnitude[threadIdx.x + half];
    }
    __syncthreads();
  }
}

// Stage 1: kL1ChangeBlocks blocks stride over the vectors; block k writes partials[k] (change) and
// partials[kL1ChangeBlocks + k] (magnitude). Double accumulators: a residual of hundreds of millions
// of values (Wan 14B at 720p) would lose its small terms in a float sum.
__global__ void l1_change_partials_kernel(const float* kept, const float* a, const float* b, int64_t count, double* partials) {
  __shared__ double shared_change[kThreads];
  __shared__ double shared_magnitude[kThreads];
  double change = 0.0, magnitude = 0.0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < count; i += stride) {
    const double previous = kept[i];
    const double fresh = __fsub_rn(a[i], b[i]);
    change += fabs(previous - fresh);
    magnitude += fabs(previous);
  }
  block_reduce(change, magnitude, shared_change, shared_magnitude);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = shared_change[0];
    partials[kL1ChangeBlocks + blockIdx.x] = shared_magnitude[0];
  }
}

// Stage 2: one block sums the partials (each thread a fixed subset, then the tree).
__global__ void l1_change_total_kernel(const double* partials, double* sums) {
  __shared__ double shared_change[kThreads];
  __shared__ double shared_magnitude[kThreads];
  double change = 0.0, magnitude = 0.0;
  for (int k = threadIdx.x; k < kL1ChangeBlocks; k += kThreads) {
    change += partials[k];
    magnitude += partials[kL1ChangeBlocks + k];
  }
  block_reduce(change, magnitude, shared_change, shared_magnitude);
  if (threadIdx.x == 0) {
    sums[0] = shared_change[0];
    sums[1] = shared_magnitude[0];
  }
}

}  // namespace

void launch_l1_change_sums(const float* kept, const float* a, const float* b, int64_t count, double* partials, double* sums,
                           cudaStream_t stream) {
  l1_change_partials_kernel<<<kL1ChangeBlocks, kThreads, 0, stream>>>(kept, a, b, count, partials);
  l1_change_total_kernel<<<1, kThreads, 0, stream>>>(partials, sums);
}

}  // namespace tessel::diffusion::cuda
