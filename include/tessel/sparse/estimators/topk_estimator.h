// dynamic_topk: SpargeAttn-style block selection from mean-pooled q and k (Zhang et al. 2025).
//
// Inputs: q (B, S_q, H_q, D), k (B, S_kv, H_kv, D), CPU, fp32/fp16/bf16, any strides;
// H_q % H_kv == 0 and query head h reads kv head h / (H_q / H_kv). Output mask: mask_batch B,
// mask_heads H_q, block sizes from the options. Exact definition (the CUDA estimator matches it;
// all arithmetic in fp32 after converting inputs to fp32):
//   0. With smooth_k (the default, as SpargeAttn's public API), k_t is replaced by k_t - mean_t k_t,
//      the mean over the whole sequence of each (batch, kv head), before anything else.
//   1. For q block r of head h (tokens t of the block, n of them):
//        pooled_q[r] = (1/n) Σ_t q_t,
//        sim_q[r]    = (1/n²) ‖Σ_t q_t / ‖q_t‖‖²   (the mean pairwise cosine, self pairs included),
//      and the same for k block c of the kv head: pooled_k[c], sim_k[c].
//      A block is self-similar iff sim > similarity_threshold, and, under rule kSpargeAttn, it is
//      whole (n = block size) and none of its tokens has norm 0 (SpargeAttn normalizes the padded
//      zero rows of a partial block too: 0/0 makes its similarity NaN). Under kReachTarget a zero
//      token contributes a zero vector and a partial block is judged on its real tokens.
//   2. Row r: score[c] = scale · pooled_q[r] · pooled_k[c] for self-similar k blocks c (the others
//      take no part), p = softmax(score) over those blocks (scale = 1/√D when options.scale = 0).
//   3. Order those blocks by (p descending, c ascending). Keep the first n of them:
//        top-k mode (cdf_threshold <= 0), value v = topk_ratio:
//          kSpargeAttn:  n = max(1, floor(fp32(v) · KVb))       (SpargeAttn's (topk * K).to(int64)),
//          kReachTarget: n = clamp(round(v · KVb), 1, KVb);
//        cdf mode (cdf_threshold > 0), value v = cdf_threshold:
//          kSpargeAttn:  n = max(1, the largest n with Σ_{first n} p <= v)  (its searchsorted),
//          kReachTarget: n = the smallest n >= 1 with Σ_{first n} p >= v;
//      n is capped at the number of self-similar k blocks. With options.per_head set, query head h
//      uses per_head[h] as v.
//   4. A q block that is not self-similar keeps its whole row; a k block that is not self-similar
//      is kept in every row (its whole column).
//   5. The options' always-keep blocks (diagonal, first sink blocks) are added.
// With similarity_threshold <= -1 and rule kReachTarget every block is self-similar (cosines are
// >= -1), so in top-k mode without always-keep each row keeps exactly n blocks.
// Steps 2 and 3 are the shared block-scoring functions (block_scoring.h: pooled scores, top-k / cdf).
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/sparse/estimators/estimate_result.h"
#include "tessel/sparse/planners/always_keep.h"

namespace tessel {

// Which definitions steps 1 and 3 use (see above): SpargeAttn's, or rounded counts and cdf cuts
// that reach their target.
enum class TopkRule : uint8_t { kSpargeAttn, kReachTarget };

struct TopkEstimatorOptions {
  double topk_ratio = 0.5;
  double cdf_threshold = 0.0;          // > 0 selects cdf mode
  // Per query head values (SpargeAttn tunes its hyperparameters per head): when non-empty, entry h
  // replaces topk_ratio (or cdf_threshold in cdf mode) for query head h; size must be H_q.
  std::vector<double> per_head;
  double similarity_threshold = 0.1;   // SpargeAttn's simthreshd1 default
  int64_t block_q = 128;
  int64_t block_kv = 64;
  float scale = 0.0f;                  // 0 = 1/sqrt(D)
  AlwaysKeep keep;                     // keep.text is ignored (no layout here)
  bool smooth_k = true;                // step 0: subtract K's mean over the sequence
  TopkRule rule = TopkRule::kSpargeAttn;
};

// Step 3's top-k count n for a ratio (shared with the CUDA estimator).
int64_t topk_count(TopkRule rule, double ratio, int64_t kv_blocks);

// CPU work on ctx.threads() threads.
EstimateResult estimate_topk_mask(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TopkEstimatorOptions& options);

}  // namespace tessel
