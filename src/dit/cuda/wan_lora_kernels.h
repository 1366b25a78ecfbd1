// Per-request LoRA on the GPU (internal to the Wan transformer's CUDA forward): the low-rank update
// y += scale * up (down x) of every run of rows that shares an adapter, for all the runs of a batch
// in two launches (SGMV-style: one grouped "shrink" v = down x, one grouped "expand"
// y += scale * up v), on tensor cores (bf16 in, fp32 accumulation).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace tessel::dit::cuda {

// The rows of one run and its adapter's pair: down (rank, in) and up (out, rank), bf16 row-major.
struct LoraSegment {
  int64_t row_begin = 0, rows = 0;
  const __nv_bfloat16* down = nullptr;
  const __nv_bfloat16* up = nullptr;
  int64_t rank = 0;
  float scale = 1.0f;
};

// For each segment, rows [row_begin, row_begin + rows) of x (.., in) and y (.., out), both
// row-major with those widths: y += scale * up (down x). x is bf16 or fp32 (x_bf16), y bf16 or fp32
// (y_bf16); `shrunk` is scratch of (rows of x) * shrunk_stride bf16, shrunk_stride >= every rank
// (the rank-wide intermediate, rounded to bf16 as a bf16 PEFT layer rounds it). Segments must not
// overlap. Enqueues on `stream`; no allocation, no synchronization.
void launch_lora_segments(const std::vector<LoraSegment>& segments, const void* x, bool x_bf16, int64_t in, void* y, bool y_bf16,
                          int64_t out, __nv_bfloat16* shrunk, int64_t shrunk_stride, cudaStream_t stream);

}  // namespace tessel::dit::cuda
