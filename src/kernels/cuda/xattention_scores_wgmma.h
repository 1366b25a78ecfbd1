// Internal: the Hopper (sm_90a, wgmma) version of the XAttention estimator's score GEMM and
// epilogue; writes the same block_lse2 workspace as the mma.sync kernel in
// xattention_estimation.cu, which stays the path for sm_80 and builds without sm_90a.
#pragma once

#include <cuda_runtime.h>

#include "tessel/kernels/cuda/xattention_estimation.h"
#include "tessel/core/dtype.h"

namespace tessel::cuda::detail {

// True when this build carries sm_90a code and the current device has compute capability 9.0.
bool xattention_wgmma_supported();

// block_lse2 for params with 128 x `cols` tiles (cols 128: two CTAs per SM; 256: one, with one
// wgmma group kept in flight across the pipeline barrier). Throws std::runtime_error when
// xattention_wgmma_supported() is false.
void launch_xattention_block_lse_wgmma(const XAttentionParams& params, DType dtype, int cols, cudaStream_t stream);

}  // namespace tessel::cuda::detail
