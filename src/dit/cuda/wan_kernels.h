// The element-wise and row-wise CUDA kernels of the Wan transformer's bf16 forward (internal).
// Matrices are row-major and contiguous, rows are tokens (batch-major, then frame-major patches).
// The residual stream and the conditioning are fp32; what feeds a GEMM or attention is bf16.
// Every launcher enqueues on `stream` and never synchronizes; callers check shapes.
//
// A "modulation" vector is the sum of a learned table row (a vector of dim, shared by all rows)
// and the time projection of the row's conditioning group: group g = row / group_rows, its vector
// at input + g * input_stride. That is diffusers' `scale_shift_table + temb`, computed where it is
// read instead of being stored per block.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tessel::dit::cuda {

using bf16 = __nv_bfloat16;

struct ModulationVector {
  const float* table = nullptr;  // (dim)
  const float* input = nullptr;  // (groups, input_stride), the vector at column offset 0
  int64_t input_stride = 0;
};

// latents (batch, channels, frames, height, width) fp32 -> patches (batch * tokens, channels * pt * ph * pw)
// bf16, one row per patch, (c, t, h, w) within a row as the Conv3d kernel is laid out.
void launch_patchify(const float* latents, bf16* patches, int64_t batch, int64_t channels, int64_t frames, int64_t height,
                     int64_t width, int64_t pt, int64_t ph, int64_t pw, cudaStream_t stream);

// The inverse for the output: rows of (t, h, w, channel) fp32 -> (batch, channels, frames, height, width).
void launch_unpatchify(const float* patches, float* out, int64_t batch, int64_t channels, int64_t frames, int64_t height,
                       int64_t width, int64_t pt, int64_t ph, int64_t pw, cudaStream_t stream);

void launch_convert_to_bf16(const float* x, bf16* y, int64_t count, cudaStream_t stream);

// y[i] = GELU(x[i]) with the exact erf form (diffusers' "gelu", the image embedder's), fp32 in, bf16 out.
void launch_gelu_to_bf16(const float* x, bf16* y, int64_t count, cudaStream_t stream);

// In place on bf16, x[i] = GELU-tanh(x[i]) in fp32: the activation a GEMM's epilogue applies, run
// apart when a per-request LoRA adds to the GEMM's output first.
void launch_gelu_tanh_bf16(bf16* x, int64_t count, cudaStream_t stream);

// x[i] += y[i] on bf16 (the sum in fp32, rounded once), as PyTorch adds two bf16 tensors.
void launch_add_bf16(bf16* x, const bf16* y, int64_t count, cudaStream_t stream);

// out (rows, dim) = x + table[row % period] fp32: a learned position table added to every batch
// entry's rows (FLF2V's image tokens).
void launch_add_periodic_rows(const float* x, const float* table, int64_t rows, int64_t dim, int64_t period, float* out,
                              cudaStream_t stream);

// out[i * repeat + j] = values[i] for j < repeat, fp32: per-frame timesteps as per-token ones.
void launch_repeat_values(const float* values, int64_t count, int64_t repeat, float* out, cudaStream_t stream);

// out[i] = x[i] * sigmoid(x[i]), fp32 (out may alias x).
void launch_silu(const float* x, float* out, int64_t count, cudaStream_t stream);

// The sinusoidal timestep embedding, cosines first, as dit::sinusoidal_embedding.
void launch_sinusoidal_embedding(const float* values, int64_t count, int64_t channels, float* out, cudaStream_t stream);

// Wan's 3-D rotary tables for a (frames, height, width) patch grid: (tokens, head_dim / 2) cosines
// and sines, angles in double rounded to fp32 (as WanRope builds them on the host).
void launch_wan_rope_tables(int64_t frames, int64_t height, int64_t width, int64_t head_dim, float* cos, float* sin,
                            cudaStream_t stream);

// y = LayerNorm(x) over rows of `dim` in fp32, then either
//   AdaLN:  y * (1 + scale) + shift   (shift.table non-null), or
//   affine: y * weight + bias          (weight non-null), or
//   plain:  y,
// stored as bf16; with fp8 non-null, the stored bf16 row also quantised to e4m3 into fp8 (rows,
// dim) with its scale in fp8_scales (rows): the bytes launch_quantize_rows_fp8 would make of y,
// without reading y again from memory (FP8 weights: the GEMMs after the norm read these).
struct RowNormOutput {
  ModulationVector shift, scale;
  const float* weight = nullptr;
  const float* bias = nullptr;
  uint8_t* fp8 = nullptr;
  float* fp8_scales = nullptr;
};
void launch_layer_norm(const float* x, bf16* y, int64_t rows, int64_t dim, int64_t group_rows, float eps,
                       const RowNormOutput& output, cudaStream_t stream);

// In place on x (rows, heads * head_dim), rows = batch * seq: RMSNorm across the whole row (all
// heads, as Wan normalizes q and k) times `weight`, then, when cos is non-null, every pair
// (2i, 2i + 1) of each head of token s = row % seq rotated by cos/sin[s, i]. fp32 inside, one
// bf16 rounding at the store.
void launch_rms_norm_rope(bf16* x, int64_t rows, int64_t seq, int64_t heads, int64_t head_dim, float eps, const float* weight,
                          const float* cos, const float* sin, cudaStream_t stream);

// The same RMSNorm + RoPE on x (batch * seq rows, heads * 128: head dim 128 only, else Error), its
// values also quantized to e4m3 as FP8 attention reads q and k (tessel/kernels/attention.h,
// fp8_attention_query_key): one scale per 64 tokens per head over the bf16 values this kernel
// rounds to, the bytes the attention's own quantizer would make of launch_rms_norm_rope's output.
// `fp8.values` (batch, seq, heads, 128) e4m3, `fp8.scales` (batch, heads, ceil(seq / 64)). The bf16
// values go back to x only when `store_bf16` (someone else reads them); otherwise x keeps its input.
struct Fp8TokenBlocks {
  uint8_t* values = nullptr;
  float* scales = nullptr;
};
void launch_rms_norm_rope_fp8(bf16* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, float eps,
                              const float* weight, const float* cos, const float* sin, bool store_bf16, const Fp8TokenBlocks& fp8,
                              cudaStream_t stream);

// x (rows, dim) fp32 += y (bf16) * gate, the gate a modulation vector; gate.table null adds y unscaled.
void launch_gated_residual(float* x, const bf16* y, int64_t rows, int64_t dim, int64_t group_rows, const ModulationVector& gate,
                           cudaStream_t stream);

// Fills `count` elements (fp32 or bf16 by `bf16_elements`) with a counter-based random stream of
// `seed`: uniform in [low, high), or normal(mean = low, stddev = high) when `normal` is set. The
// same seed gives the same values on every GPU.
void launch_fill_random(void* data, bool bf16_elements, int64_t count, uint64_t seed, bool normal, float low, float high,
                        cudaStream_t stream);

}  // namespace tessel::dit::cuda
