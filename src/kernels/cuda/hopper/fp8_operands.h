// Internal: the FP8 (e4m3) operands of the Hopper kernel's FP8 mode (AttentionPrecision::kFp8),
// made on the device from the bf16/fp16 q, k, v in stream order before the attention kernel, in
// SageAttention's manner:
//  - q and k: one scale per 64 tokens per head (the absolute maximum of the block over 448, e4m3's
//    largest finite value), so an outlier token costs precision only in its own block; the Hopper
//    kernel's consumer warpgroups own 64 query rows and its key sub-tiles are 64 keys, so each
//    QK^T tile multiplies by one q scale and one k scale;
//  - v: one scale per channel per head over the whole sequence (the P V product sums over keys, so
//    a per-key scale could not be taken out of the sum), stored transposed (B, H_kv, D, S_pad) so
//    that the keys are the contiguous (K-major) axis FP8 wgmma needs for its B operand, with the
//    keys of each 32-key group permuted into the order in which the S accumulator layout hands P
//    to the A-register fragment (fp8_key_order below) — no register shuffles in the kernel;
//  - with K smoothing (the FP8 variants' smooth_k), k less its channel means over the whole
//    sequence before the block scales are taken (q . mean is the same for every key of a row, so
//    the softmax is unchanged, while the blocks' maxima lose the shared offset that DiT keys carry
//    and keep more bits for what differs between keys); each row's LSE gets softmax scale x
//    q . mean back in the kernel's epilogue.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/flash_params.h"
#include "tessel/core/dtype.h"
#include "tessel/core/exec_context.h"

namespace tessel::cuda::detail {

// e4m3's largest finite value: a block's absolute maximum maps to it.
inline constexpr float kFp8Max = 448.0f;
// The factor that turns e4m3 values back into a channel or block whose absolute maximum is
// `absmax` (448 maps to absmax); an all-zero block keeps factor 1.
__host__ __device__ inline float fp8_dequantization(float absmax) { return absmax > 0.f ? absmax / kFp8Max : 1.f; }
// Tokens per q / k scale.
inline constexpr int kFp8ScaleBlock = 64;

struct Fp8Operands {
  uint8_t* q = nullptr;         // (B, S_q, H_q, D) contiguous
  uint8_t* k = nullptr;         // (B, S_kv, H_kv, D) contiguous
  uint8_t* vt = nullptr;        // (B, H_kv, D, seq_kv_padded), keys permuted per 32-key group
  float* q_scale = nullptr;     // (B, H_q, q_blocks) dequantization factors
  float* k_scale = nullptr;     // (B, H_kv, kv_blocks)
  uint32_t* v_absmax = nullptr;  // (B, H_kv, D) channel maxima as float bits (scale = max / 448)
  // K smoothing only: k's channel sums per 256-key slice (B, H_kv, slices, D), summed in order into
  // the channel means (B, H_kv, D) (no atomics: the same bits every run), and the LSE shifts
  // (B, H_q, S_q), softmax scale x q . mean in natural-log units.
  float* k_slice_sums = nullptr;
  float* k_mean = nullptr;
  float* lse_shift = nullptr;
  int seq_kv_padded = 0;        // S_kv rounded up to 64 (zeros past S_kv)
};

struct Fp8Shape {
  int64_t batch, seq_q, seq_kv, heads_q, heads_kv, head_dim;
};

// Device bytes of the operands (with the slicer's alignment between slices).
size_t fp8_operand_bytes(const Fp8Shape& shape);
// The operands' slices of `workspace` (throws Error naming the slice when it is short).
Fp8Operands take_fp8_operands(const Workspace& workspace, const Fp8Shape& shape);

// Quantizes params.q/k/v (dtype bf16 or fp16, head dim 128) into `operands` on `stream`, with K
// smoothing when `smooth_k` (the operands always have its room). Without `quantize_query_key` only
// v is quantized (q and k came quantized from their producer; smooth_k must then be false).
void launch_fp8_quantize(const FlashParams& params, DType dtype, const Fp8Shape& shape, const Fp8Operands& operands,
                         bool smooth_k, bool quantize_query_key, cudaStream_t stream);

// The key whose P value sits at position `slot` (0..31) of a 32-key group of an FP8 A fragment
// built from the S accumulators without shuffles: slot 4q + i of the low (high) 16 holds column
// 2q + i (8 + 2q + i - 2) of the low (high) 16 keys. The transposed v stores key
// fp8_key_order(slot) of each group at position slot.
__host__ __device__ constexpr int fp8_key_order(int slot) {
  const int high = slot >> 4, quad = (slot & 15) >> 2, i = slot & 3;
  return 16 * high + (i < 2 ? 2 * quad + i : 8 + 2 * quad + (i - 2));
}

}  // namespace tessel::cuda::detail
