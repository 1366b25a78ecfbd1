// The element-wise and attention CUDA kernels of the UMT5 encoder's bf16 forward (internal).
// Rows are tokens (batch-major), row-major and contiguous. The residual stream is fp32; what feeds
// a GEMM is bf16. Every launcher enqueues on `stream` and never synchronizes; callers check shapes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tessel::diffusion::cuda {

using bf16 = __nv_bfloat16;

// hidden (rows, width) fp32 = the embedding rows (bf16) of ids (rows).
void launch_embedding_gather(const int32_t* ids, const bf16* table, float* hidden, int64_t rows, int64_t width,
                             cudaStream_t stream);

// T5's RMSNorm over rows of `width` in fp32 (no mean subtraction): y = x * rsqrt(mean(x^2) + eps) * weight,
// stored as bf16 (y_bf16) or fp32 (y_f32); exactly one of the two is non-null.
void launch_t5_rms_norm(const float* x, const float* weight, bf16* y_bf16, float* y_f32, int64_t rows, int64_t width,
                        float eps, cudaStream_t stream);

// gate (bf16) = gate * up, in fp32, rounded once (the GELU was applied by the GEMM's epilogue).
void launch_gated_product(bf16* gate, const bf16* up, int64_t count, cudaStream_t stream);

// T5 self-attention with a relative position bias, no scaling: for batch b, head h, query i,
//   out[b, i, h] = softmax_j(q[b, i, h] . k[b, j, h] + bias[bucket[j - i + length - 1], h], over the
//   keys j with mask[b, j] != 0) . v[b, j, h]
// q, k, v, out: (batch * length, heads * head_dim) bf16; bias (buckets, heads) fp32; bucket
// (2 * length - 1) int32; mask (batch, length) int32. head_dim <= kMaxT5HeadDim. A row whose keys
// are all masked gets zeros.
inline constexpr int64_t kMaxT5HeadDim = 128;
void launch_t5_attention(const bf16* q, const bf16* k, const bf16* v, const float* bias, const int32_t* bucket,
                         const int32_t* mask, bf16* out, int64_t batch, int64_t length, int64_t heads, int64_t head_dim,
                         cudaStream_t stream);

}  // namespace tessel::diffusion::cuda
