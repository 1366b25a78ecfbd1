// The CPU fp32 operations DiT models are built from (the ggml of this layer): GEMM with bias,
// LayerNorm with and without AdaLN modulation, RMSNorm, activations, rotary embedding of pairs,
// gated residuals, sinusoidal embeddings. Public so that the diffusion layer's CPU encoders (the
// CLIP vision encoder) share the tuned GEMM. Matrices are row-major and contiguous; callers check
// shapes (these trust their arguments). Norms accumulate in double, so their rounding is that of
// the final fp32 store.
#pragma once

#include <cstdint>

#include "tessel/core/exec_context.h"

namespace tessel::dit {

// y (m, n) = x (m, k) · w_t (k, n) + bias (n). w_t is a PyTorch Linear weight transposed once at
// load time (in_features, out_features), so the inner loop runs along contiguous rows of both
// w_t and y. bias may be null.
void linear(const ExecContext& ctx, const float* x, int64_t m, int64_t k, const float* w_t, const float* bias, int64_t n,
            float* y);

// LayerNorm over rows of `dim`: y = (x - mean) / sqrt(var + eps) [* weight + bias]; weight and
// bias null for the non-affine norm. y may alias x.
void layer_norm(const ExecContext& ctx, const float* x, int64_t rows, int64_t dim, double eps, const float* weight,
                const float* bias, float* y);

// AdaLN: y = layer_norm(x) * (1 + scale) + shift, where the `rows_per_batch` rows of batch b use
// shift + b * modulation_stride and scale + b * modulation_stride (vectors of `dim`).
void layer_norm_modulate(const ExecContext& ctx, const float* x, int64_t batch, int64_t rows_per_batch, int64_t dim,
                         double eps, const float* shift, const float* scale, int64_t modulation_stride, float* y);

// In place: x = x / sqrt(mean(x^2) + eps) * weight, over rows of `dim`.
void rms_norm(const ExecContext& ctx, float* x, int64_t rows, int64_t dim, double eps, const float* weight);

// In place, element-wise. gelu is GELU's exact erf form, gelu_tanh its tanh approximation.
void gelu(const ExecContext& ctx, float* x, int64_t count);
void gelu_tanh(const ExecContext& ctx, float* x, int64_t count);
void silu(const ExecContext& ctx, float* x, int64_t count);

// In place on x (batch, seq, heads, head_dim): each pair (x[2i], x[2i+1]) of every head of token s
// is rotated by the angle whose cosine and sine are cos[s, i] and sin[s, i] (tables of
// (seq, head_dim / 2)).
void rotate_pairs(const ExecContext& ctx, float* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                  const float* cos, const float* sin);

// x += y * gate, where the rows of batch b use gate + b * gate_stride (a vector of `dim`); gate
// null adds y unscaled.
void gated_residual(const ExecContext& ctx, float* x, const float* y, int64_t batch, int64_t rows_per_batch, int64_t dim,
                    const float* gate, int64_t gate_stride);

// The sinusoidal embedding of each value (rows of `channels`, cosines first, as diffusers'
// Timesteps(flip_sin_to_cos=True, downscale_freq_shift=0)): for i < channels / 2,
// out[i] = cos(t * f_i), out[channels / 2 + i] = sin(t * f_i), f_i = exp(-ln(10000) * i / (channels / 2)),
// computed in fp32 as PyTorch does.
void sinusoidal_embedding(const float* values, int64_t count, int64_t channels, float* out);

}  // namespace tessel::dit
