// Per-request LoRA on the GPU (internal to the Wan transformer's CUDA forward): the low-rank update
// y += scale * up (down x) of every run of rows that shares an adapter, through cuBLASLt (bf16 in,
// fp32 accumulation). A run's rows are contiguous (consecutive batch entries), so each run is two
// full-size GEMMs: the shrink v = x down^T into bf16 scratch and the expand y += scale v up^T,
// added in place (beta = 1).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "tessel/core/dtype.h"
#include "tessel/kernels/cuda/cublaslt_gemm.h"

namespace tessel::dit::cuda {

// The rows of one run and its adapter's pair: down (rank, in) and up (out, rank), bf16 row-major.
struct LoraSegment {
  int64_t row_begin = 0, rows = 0;
  const __nv_bfloat16* down = nullptr;
  const __nv_bfloat16* up = nullptr;
  int64_t rank = 0;
  float scale = 1.0f;
};

// The layer an update goes into: x (.., in) and y (.., out), row-major with those widths; x bf16 or
// fp32, y bf16 or fp32.
struct LoraLayer {
  const void* x = nullptr;
  DType x_type = DType::kBF16;
  int64_t in = 0;
  void* y = nullptr;
  DType y_type = DType::kBF16;
  int64_t out = 0;
};

// The scratch an update uses: `shrunk`, (rows of x) * shrunk_stride bf16 with shrunk_stride >= every
// rank (the rank-wide intermediate, rounded to bf16 as a bf16 PEFT layer rounds it); `x_bf16`, (rows
// of x) * in bf16 when x is fp32 (x rounded to bf16 for the bf16 GEMM, as the factors are), else
// unused; `gemm_workspace`, CublasLtGemm::kWorkspaceBytes.
struct LoraScratch {
  __nv_bfloat16* shrunk = nullptr;
  int64_t shrunk_stride = 0;
  __nv_bfloat16* x_bf16 = nullptr;
  void* gemm_workspace = nullptr;
};

// For each segment, rows [row_begin, row_begin + rows) of the layer: y += scale * up (down x).
// Segments must not overlap. Enqueues on `stream`; no allocation, no synchronization (capturable
// once each shape's cuBLASLt plan is cached).
void add_lora_segments(const tessel::cuda::CublasLtGemm& gemm, const std::vector<LoraSegment>& segments, const LoraLayer& layer,
                       const LoraScratch& scratch, cudaStream_t stream);

}  // namespace tessel::dit::cuda
