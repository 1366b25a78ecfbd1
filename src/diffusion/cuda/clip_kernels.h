// The CUDA kernels of the CLIP vision encoder's fp32 forward (internal; clip_cuda_encoder.h). Rows
// are tokens (image-major), row-major and contiguous. Every launcher enqueues on `stream` and never
// synchronizes; callers check shapes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tessel::diffusion::cuda {

// The patch embedding's input: pixels (batch, channels, image_size, image_size) -> rows (batch *
// side^2, channels * patch^2), side = image_size / patch, each row one patch's (channel, row,
// column) values, the order of the convolution's weight, so the convolution is one GEMM.
void launch_clip_patch_rows(const float* pixels, float* rows, int64_t batch, int64_t channels, int64_t image_size, int64_t patch,
                            cudaStream_t stream);

// hidden (batch * tokens, width) = [class_embedding; patches of the image] + position (tokens,
// width); patches (batch * (tokens - 1), width).
void launch_clip_embed(const float* patches, const float* class_embedding, const float* position, float* hidden, int64_t batch,
                       int64_t tokens, int64_t width, cudaStream_t stream);

// y = (x - mean) / sqrt(var + eps) * weight + bias over each row of `width` (torch's LayerNorm; the
// statistics in fp32, two passes). y may alias x.
void launch_clip_layer_norm(const float* x, const float* weight, const float* bias, float* y, int64_t rows, int64_t width, float eps,
                            cudaStream_t stream);

// In place: exact GELU, 0.5 x (1 + erf(x / sqrt 2)), or quick_gelu, x sigmoid(1.702 x).
void launch_clip_activation(float* x, int64_t count, bool quick, cudaStream_t stream);

// Unmasked multi-head attention in fp32, as transformers' CLIPAttention on pixel inputs: for image
// b, head h, query i, out[b, i, h] = softmax_j(scale q[b, i, h] . k[b, j, h]) . v[b, j, h]. q, k, v
// are rows of `qkv_stride` floats (the fused projection: q at column 0, k at width, v at 2 width,
// head h at h head_dim within each); out (batch * tokens, heads * head_dim). head_dim <=
// kMaxClipHeadDim.
inline constexpr int64_t kMaxClipHeadDim = 128;
void launch_clip_attention(const float* qkv, int64_t qkv_stride, float* out, int64_t batch, int64_t tokens, int64_t heads,
                           int64_t head_dim, float scale, cudaStream_t stream);

}  // namespace tessel::diffusion::cuda
