// dynamic_topk: SpargeAttn-style block selection from mean-pooled q and k (Zhang et al. 2025).
//
// Inputs: q (B, S_q, H_q, D), k (B, S_kv, H_kv, D), CPU, fp32/fp16/bf16, any strides;
// H_q % H_kv == 0 and query head h reads kv head h / (H_q / H_kv). Output mask: mask_batch B,
// mask_heads H_q, block sizes from the options. Exact definition (the CUDA estimator matches it;
// all arithmetic in fp32 after converting inputs to fp32):
//   1. For q block r of head h (tokens t of the block, n of them):
//        pooled_q[r] = (1/n) Σ_t q_t,
//        sim_q[r]    = (1/n²) ‖Σ_t q_t / ‖q_t‖‖²   (the mean pairwise cosine, self pairs included;
//                                                  a zero token contributes a zero vector),
//      and the same for k block c of the kv head: pooled_k[c], sim_k[c].
//      A block is self-similar iff sim > similarity_threshold.
//   2. Row r: score[c] = scale · pooled_q[r] · pooled_k[c] for self-similar k blocks c (the others
//      take no part), p = softmax(score) over those blocks (scale = 1/√D when options.scale = 0).
//   3. Order those blocks by (p descending, c ascending). Keep the first n of them:
//        top-k mode (cdf_threshold <= 0): n = clamp(round(topk_ratio · KVb), 1, KVb);
//        cdf mode   (cdf_threshold > 0):  n = the smallest n >= 1 with Σ_{first n} p >= cdf_threshold;
//      n is capped at the number of self-similar k blocks. With options.per_head set, query head h
//      uses per_head[h] in place of topk_ratio (top-k mode) or cdf_threshold (cdf mode).
//   4. A q block that is not self-similar keeps its whole row; a k block that is not self-similar
//      is kept in every row (its whole column).
//   5. The options' always-keep blocks (diagonal, first sink blocks) are added.
// With similarity_threshold <= -1 every block is self-similar (cosines are >= -1), so in top-k
// mode without always-keep each row keeps exactly n blocks.
// Steps 2 and 3 are the shared block-scoring functions (block_scoring.h: pooled scores, top-k / cdf).
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/sparse/estimators/estimate_result.h"
#include "tessel/sparse/planners/always_keep.h"

namespace tessel {

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
};

// CPU work on ctx.threads() threads.
EstimateResult estimate_topk_mask(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TopkEstimatorOptions& options);

}  // namespace tessel
