// Block scoring and selection shared by every estimator that builds a block mask from data (the
// DiT estimators and the KV-cache sparse policies): scores per (query block, kv block), the
// selection rules over one row of scores, and the aggregation of per-head choices.
//
// Scores:
//   pooled (SpargeAttn-style top-k): softmax over candidate kv blocks of scale · pooled_q · pooled_k,
//   from mean-pooled query and key blocks;
//   strided antidiagonal (XAttention): for stride s, query group g holds tokens [gs, gs + s) in
//   reversed order and key group g' tokens [g's, g's + s) in order, so the dot product of the two
//   flattened (s·D) groups is the antidiagonal Σ_i q[gs + s-1-i] · k[g's + i]. Each query group's
//   logits (dot · scale) are softmaxed over all key groups, and the probabilities are summed per
//   kv block: a block's mass. Zero key groups (padding) may join each softmax with logit 0; their
//   probabilities land in the blocks that hold them.
// Selection of one row (ties: lower block index first):
//   top-k: the n highest;  cdf: the fewest highest whose probabilities sum to >= p, or (SpargeAttn's
//   cut) the most highest whose probabilities sum to <= p;
//   τ (threshold): the blocks already kept count, then the highest until the kept mass >= target.
// Aggregation: GQA "any" (a kv head keeps a block when any of its query heads does) and the column
// vote (a kv block is kept in every row when more than a fraction of the rows keep it).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tessel/sparse/planners/always_keep.h"

namespace tessel::block_scoring {

// Σ a[i]·b[i] over n fp32 values, accumulated in fp32 (vectorized without -ffast-math).
inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// out[(g·s + t)·dim ..] = rows[(g·s + s-1-t)·dim ..] for every group g < groups: reverses the
// tokens of each stride group, the query side of antidiagonal scoring.
void reverse_stride_groups(const float* rows, int64_t groups, int64_t stride, int64_t dim, float* out);

// Antidiagonal block mass of `num_rows` query groups (rows, num_rows × width, already reversed)
// against `num_columns` key groups (columns, num_columns × width): for each row, softmax over all
// columns of dot · scale, and mass[column_block[j]] += probability of column j (accumulated in
// double). column_block has num_columns entries, each in [0, mass.size()). When
// zero_columns_per_block is given (mass.size() entries), block c also holds that many zero key
// groups: they join every softmax with logit 0 and their probabilities are added to mass[c].
void add_antidiagonal_mass(const float* rows, int64_t num_rows, const float* columns, int64_t num_columns,
                           int64_t width, float scale, std::span<const int32_t> column_block, std::span<double> mass,
                           std::span<const int32_t> zero_columns_per_block = {});

// Pooled scores of one query block: prob[c] = softmax over c in candidates of
// scale · pooled_q[0..dim) · pooled_k[c·dim ..) (fp32); entries of other blocks are left as they are.
void pooled_softmax_scores(const float* pooled_q, const float* pooled_k, std::span<const int32_t> candidates,
                           int64_t dim, float scale, float* prob);

// Selection over one row of n block scores (fp32 scores of the estimators, fp64 scores of the KV
// policies). Blocks with keep[c] = 1 on entry are the always-kept ones: they stay, and the rule
// chooses among the others, ranked by score descending, index ascending on ties.
//   top-k: the k highest of the others (all of them when fewer);
//   cdf:   the fewest highest of the others whose scores sum (in fp32) to >= p, at least one;
//   cdf at most (SpargeAttn's searchsorted cut): the most highest of the others whose scores sum
//          (in fp32) to <= p, at least one;
//   τ:     the always-kept scores count first, then the highest others while the kept sum < target.
void keep_top_k(const float* score, int64_t n, int64_t k, uint8_t* keep);
void keep_top_k(const double* score, int64_t n, int64_t k, uint8_t* keep);
void keep_until_cdf(const float* score, int64_t n, double p, uint8_t* keep);
void keep_while_cdf_at_most(const float* score, int64_t n, double p, uint8_t* keep);
void keep_until_mass(const float* score, int64_t n, double target, uint8_t* keep);

// The always-keep rule for a row of n blocks that has no query position (a KV cache's history):
// sets keep[c] for always's sink blocks (the first ones) and recent blocks (the last ones).
void keep_sink_and_recent(const AlwaysKeep& always, int64_t n, uint8_t* keep);

// GQA any: from per query head choices (batch, heads, plane) to per kv head choices
// (batch, kv_heads, plane), query head h belonging to kv head h / (heads / kv_heads).
std::vector<uint8_t> merge_gqa_any(std::span<const uint8_t> per_head, int64_t batch, int64_t heads, int64_t kv_heads,
                                   int64_t plane);

// Column vote over a (rows × columns) keep map: column c is kept when more than
// vote_fraction · rows of the rows keep it, or when `always` keeps it in every row (its sink
// blocks and its recent blocks; the diagonal depends on the row and does not apply here).
std::vector<uint8_t> vote_columns(std::span<const uint8_t> keep, int64_t rows, int64_t columns, double vote_fraction,
                                  const AlwaysKeep& always);

}  // namespace tessel::block_scoring
