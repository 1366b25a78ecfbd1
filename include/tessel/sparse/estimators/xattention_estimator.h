// threshold: XAttention block selection (Xu et al. 2025) by strided antidiagonal scoring, for
// non-causal attention (DiT self attention, full prefill).
//
// Inputs as the top-k estimator: q (B, S_q, H_q, D), k (B, S_kv, H_kv, D), CPU fp32/fp16/bf16.
// block_q and block_kv must be multiples of the stride S (8 or 16). Exact definition (fp32):
//   1. Query group g holds tokens [gS, gS + S), key group g' tokens [g'S, g'S + S); tokens past the
//      sequence end count as zero vectors. Gq = ceil(S_q / S), Gk = ceil(S_kv / S).
//   2. A[g][g'] = Σ_{i=0}^{S-1} q[gS + S - 1 - i] · k[g'S + i]  (one antidiagonal of the S×S tile),
//      logit = A · scale / S  (scale = 1/√D when options.scale = 0).
//   3. P[g][·] = softmax over all g' of the logits of row g.
//   4. mass[r][c] = Σ_{g in q block r} Σ_{g' in kv block c} P[g][g'] (block r holds groups
//      [r·block_q/S, (r+1)·block_q/S), likewise c).
//   5. Row r: forced = {the diagonal kv blocks (AlwaysKeep::diagonal's definition) if keep_diagonal}
//      ∪ {block 0 if keep_first}. Then, in order of (mass descending, c ascending), add blocks
//      while Σ kept mass < threshold · Σ_c mass[r][c]. The kept set is the smallest that contains
//      the forced blocks and reaches the threshold (per_head_threshold[h] for query head h when
//      given).
//   6. Aggregation (optional, as xattention-bsa-policy.md):
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
};

// CPU work on ctx.threads() threads.
EstimateResult estimate_xattention_mask(const ExecContext& ctx, const TensorView& q, const TensorView& k, const XAttentionOptions& options);

// Step 4 alone, for tests and for the CUDA estimator's comparison: the (B, H_q, Qb, KVb) block
// masses, row-major.
std::vector<float> xattention_block_mass(const ExecContext& ctx, const TensorView& q, const TensorView& k, const XAttentionOptions& options);

}  // namespace tessel
