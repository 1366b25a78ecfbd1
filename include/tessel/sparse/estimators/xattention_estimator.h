// threshold: XAttention block selection (Xu et al. 2025) by strided antidiagonal scoring, for
// non-causal attention (DiT self attention, full prefill).
//
// Inputs as the top-k estimator: q (B, S_q, H_q, D), k (B, S_kv, H_kv, D), CPU fp32/fp16/bf16.
// block_q and block_kv must be multiples of the stride S (8 or 16). Exact definition (fp32):
//   1. Query group g holds tokens [gS, gS + S), key group g' tokens [g'S, g'S + S); tokens past the
//      sequence end count as zero vectors. Gq = ceil(S_q / S), Gk = ceil(S_kv / S).
//   2. A[g][g'] = Σ_{i=0}^{S-1} q[gS + S - 1 - i] · k[g'S + i]  (one antidiagonal of the S×S tile),
//      logit = A · scale / S  (scale = 1/√D when options.scale = 0).
//   3. P[g][·] = softmax over all g' of the logits of row g. With padding = kChunk (the default, as
//      the official non-causal estimate), the keys are first padded with zero tokens to a multiple
//      of the chunk size C = max(2048, min(p, 2^28 / p)), p the smallest power of two >= S_kv:
//      the Z = S_kv_padded / S - Gk zero key groups join every softmax with logit 0.
//   4. mass[r][c] = Σ_{g in q block r} Σ_{g' in kv block c} P[g][g'] (block r holds groups
//      [r·block_q/S, (r+1)·block_q/S), likewise c). Zero key groups add their probabilities to the
//      blocks that hold them: the partial last kv block and the padding blocks past the end.
//   5. Row r (its blocks and, with kChunk, the padding blocks): forced = {the diagonal kv blocks
//      (AlwaysKeep::diagonal's definition) if keep_diagonal}. Then, in order of (mass descending,
//      c ascending), add blocks while Σ kept mass < threshold · Σ_c mass[r][c] (per_head_threshold[h]
//      for query head h when given): the smallest set that contains the forced blocks and reaches
//      the threshold. The padding blocks are then dropped, and block 0 is added if keep_first
//      (after the selection, without counting toward it, as the official selection keeps it).
//   6. Aggregation (optional, as the XAttention-BSA policy of the KV layer does):
//        gqa_any: a kv head keeps a block iff any of its query heads does (mask_heads = H_kv);
//        vote = kHeads: block (r, c) is kept iff more than half of the heads keep it
//                       (mask_heads = 1), then the forced blocks are added again;
//        vote = kColumns: kv block c is kept in every row iff more than vote_threshold (default
//                       one half) of all (head, row) pairs keep it (the chunked-prefill vote; the
//                       first and last kv blocks always), then the forced blocks are added again.
// Scoring and selection are the shared block-scoring functions (block_scoring.h); the KV cache's
// XAttention-BSA policy runs the same ones over the history blocks of a prefill chunk.
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/sparse/estimators/estimate_result.h"

namespace tessel {

enum class XAttentionVote : uint8_t { kNone, kHeads, kColumns };
// Step 3: zero-padded keys in the softmax as the official code (kChunk), or the real keys only.
enum class XAttentionPadding : uint8_t { kChunk, kNone };

struct XAttentionOptions {
  double threshold = 0.95;
  // When non-empty, entry h replaces threshold for query head h (size H_q).
  std::vector<double> per_head_threshold;
  int64_t stride = 8;
  int64_t block_q = 128;
  int64_t block_kv = 64;
  float scale = 0.0f;
  bool keep_diagonal = true;
  bool keep_first = true;
  bool gqa_any = false;
  XAttentionVote vote = XAttentionVote::kNone;
  // kColumns: a kv block needs more than this fraction of the (head, query block) votes, in [0, 1).
  double vote_threshold = 0.5;
  XAttentionPadding padding = XAttentionPadding::kChunk;
};

// Step 3's padded key length: S_kv rounded up to a multiple of the official chunk size.
int64_t xattention_padded_length(int64_t seq_kv);

// CPU work on ctx.threads() threads.
EstimateResult estimate_xattention_mask(const ExecContext& ctx, const TensorView& q, const TensorView& k, const XAttentionOptions& options);

// Step 4 alone, for tests and for the CUDA estimator's comparison: the (B, H_q, Qb, KVb) block
// masses of the real blocks, row-major.
std::vector<float> xattention_block_mass(const ExecContext& ctx, const TensorView& q, const TensorView& k, const XAttentionOptions& options);

}  // namespace tessel
