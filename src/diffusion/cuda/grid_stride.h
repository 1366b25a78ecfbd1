// Launch shapes of the diffusion layer's element-wise CUDA kernels (internal, for .cu files): blocks
// of kGridThreads threads, a grid of at most kGridMaxBlocks blocks, and a grid-stride loop over the
// elements, so any count runs on any grid.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tessel::diffusion::cuda {

inline constexpr int kGridThreads = 256;
inline constexpr int64_t kGridMaxBlocks = int64_t{65535} * 8;

// The blocks for `count` elements: one per kGridThreads, at least 1, at most kGridMaxBlocks.
inline unsigned grid_blocks(int64_t count) {
  return static_cast<unsigned>(std::clamp<int64_t>((count + kGridThreads - 1) / kGridThreads, 1, kGridMaxBlocks));
}

}  // namespace tessel::diffusion::cuda

// for (i over [0, count) in the grid's threads, each i once)
#define TESSEL_GRID_STRIDE(i, count) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (count); i += static_cast<int64_t>(gridDim.x) * blockDim.x)
