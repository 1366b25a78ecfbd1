// Attention entry points. Each takes the execution context first (exec_context.h), dispatches on
// the tensors' device (CPU kernels, or CUDA kernels when built with CUDA) and validates every
// argument first: bad input throws tessel::Error and writes nothing. CUDA work is enqueued on
// ctx.stream without synchronizing with the host; CPU work runs on ctx.threads() threads.
//
// Layout: q (B, S_q, H_q, D); k, v (B, S_kv, H_kv, D); out (B, S_q, H_q, D), same dtype as q.
// GQA: H_q % H_kv == 0, query head h reads kv head h / (H_q / H_kv).
// lse: optional fp32 (B, H_q, S_q), natural log with the scale folded in; -inf for rows with no key
// (their output is 0). Pass an empty TensorView{} to skip it.
#pragma once

#include <cstdint>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/kernels/block_mask_view.h"

namespace tessel {

// What the matrix products run in. kFp8 (opt-in, CUDA on compute capability 9.0, head dim 128,
// bf16/fp16 q, k, v and out): q and k are quantized to e4m3 with one scale per 64 tokens per head,
// v with one scale per channel per head, P to e4m3; QK^T and PV run in FP8 with fp32 accumulation.
// The output error is about 5% (relative L2) on random inputs, against bf16's 0.2%. It needs
// ctx.workspace with attention_workspace_bytes for dims with precision kFp8 (the quantized copies).
enum class AttentionPrecision : uint8_t { kInput, kFp8 };

struct AttentionOptions {
  float scale = 0.0f;        // 0 means 1/sqrt(D)
  bool causal = false;       // bottom-right aligned when S_q != S_kv (FlashAttention's convention)
  int64_t window_left = -1;  // sliding window in tokens; -1 = unbounded
  int64_t window_right = -1;
  AttentionPrecision precision = AttentionPrecision::kInput;
  // Multiprocessors the persistent CUDA kernel leaves free (FlashAttention-3's sm_margin): a kernel
  // that takes every SM keeps a concurrent kernel (an NCCL exchange on another stream) from starting,
  // or leaves some of its own CTAs waiting for a second wave behind it. Ring attention sets it on
  // block-sparse steps while its K/V exchange is in flight (ParallelConfig::ring_sm_margin). Values
  // past the device's count leave one multiprocessor; ignored on CPU.
  int sm_margin = 0;
  // kFp8 only: q and k are in ctx.workspace already, as the e4m3 operands fp8_attention_query_key
  // names, written by the kernel that made them (the Wan runtime's RMSNorm + RoPE quantizes them on
  // its way out, so no pass reads q and k again); the call quantizes v alone. q and k still give
  // the call's shapes and device, their values are not read. K smoothing (a forced "+smoothk" FP8
  // variant) is then skipped: it needs k's channel means over every key before k's block scales.
  bool fp8_query_key_given = false;

  // Query i may see key j iff lo(i) <= j <= hi(i) where, with shift = S_kv - S_q,
  //   hi = causal ? min(i + shift, i + shift + window_right) : i + shift + window_right (if >= 0)
  //   lo = i + shift - window_left (if window_left >= 0)
};

// Effective scale: options.scale, or 1/sqrt(head_dim) when it is 0.
float attention_scale(const AttentionOptions& options, int64_t head_dim);

// The sizes of an attention call, for sizing a workspace before the tensors exist.
struct AttentionDims {
  int64_t batch = 1, seq_q = 0, seq_kv = 0, heads = 1, kv_heads = 1, head_dim = 0;
  AttentionPrecision precision = AttentionPrecision::kInput;  // kFp8: room for the quantized copies too
};

// Bytes of ctx.workspace that attention_forward and block_sparse_attention_forward take for
// `dims` on `device` with ctx.threads() threads: enough for dense attention and for block masks
// whose kv blocks hold at least mask_block_kv tokens (0: dense only). Reserve it at plan time; a
// call with a smaller workspace throws Error before writing anything, a call without a workspace
// allocates its own (slower). On CUDA it is 0 for dense attention and, for block masks, the room
// of a schedule that runs the mask rows that keep the most blocks first; CUDA calls never
// allocate: without that room (or with a workspace on another device) they run in a static order.
// With dims.precision kFp8 it also holds the quantized q, k, v (about (S_q H_q + 2 S_kv H_kv) D
// bytes), which FP8 calls require.
size_t attention_workspace_bytes(const ExecContext& ctx, Device device, const AttentionDims& dims,
                                 int64_t mask_block_kv = 0);

// Where an FP8 call of `dims` (precision kFp8) on the CUDA `device` keeps the e4m3 copies of q and
// k in ctx.workspace (sized by attention_workspace_bytes for those dims), for a kernel that makes q
// and k to write them itself (AttentionOptions::fp8_query_key_given):
//   q (B, S_q, H_q, D) and k (B, S_kv, H_kv, D) contiguous e4m3 bytes, each value x * 448 / m
//   rounded to nearest (saturating), where m is the absolute maximum of the kFp8TokenBlock tokens
//   x's token belongs to (tokens [64 j, 64 j + 64) of one batch entry and head);
//   q_scales (B, H_q, ceil(S_q / 64)) and k_scales (B, H_kv, ceil(S_kv / 64)) fp32: m / 448, 1 for
//   an all-zero block.
// Throws Error naming ctx.workspace when it is missing, short or on another device, and naming the
// device on a CPU device or a build without CUDA.
inline constexpr int64_t kFp8TokenBlock = 64;
struct Fp8QueryKey {
  uint8_t* q = nullptr;
  float* q_scales = nullptr;
  uint8_t* k = nullptr;
  float* k_scales = nullptr;
};
Fp8QueryKey fp8_attention_query_key(const ExecContext& ctx, Device device, const AttentionDims& dims);

void attention_forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                       const TensorView& lse, const AttentionOptions& options = {});

// Visits only the kv blocks the mask keeps for each (batch, head, q block). Token-level causal /
// window limits in `options` still apply inside kept blocks, and so do the mask's sub-block bits
// when it has them (block_mask_view.h); a row left with no key gets output 0 and lse -inf.
void block_sparse_attention_forward(const ExecContext& ctx, const TensorView& q, const TensorView& k,
                                    const TensorView& v, const BlockMaskView& mask, const TensorView& out, const TensorView& lse,
                                    const AttentionOptions& options = {});

// Combines two partial results over disjoint key sets (max-shifted form, docs/architecture.md).
// out_* (B, S, H, D) any float dtype; lse_* fp32 (B, H, S). out/lse may alias a or b.
void merge_attention_states(const ExecContext& ctx, const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                            const TensorView& lse_b, const TensorView& out, const TensorView& lse);

}  // namespace tessel
