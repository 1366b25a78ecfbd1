// Block scoring and selection shared by every estimator that builds a block mask from data (the
// DiT estimators and the KV-cache sparse policies): scores per (query block, kv block), the
// selection rules over one row of scores, and the aggregation of per-head choices.
//
// Scores:
//   strided antidiagonal (XAttention): for stride s, query group g holds tokens [gs, gs + s) in
//   reversed order and key group g' tokens [g's, g's + s) in order, so the dot product of the two
//   flattened (s·D) groups is the antidiagonal Σ_i q[gs + s-1-i] · k[g's + i]. Each query group's
//   logits (dot · scale) are softmaxed over all key groups, and the probabilities are summed per
//   kv block: a block's mass.
// Selection of one row (ties: lower block index first):
//   top-k: the n highest;  cdf: the fewest highest whose probabilities sum to >= p;
//   τ (threshold): the blocks already kept count, then the highest until the kept mass >= target.
// Aggregation: GQA "any" (a kv head keeps a block when any of its query heads does) and the column
// vote (a kv block is kept in every row when more than a fraction of the rows keep it).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tessel/sparse/planners/always_keep.h"

namespace tessel::block_scoring {

// out[(g·s + t)·dim ..] = rows[(g·s + s-1-t)·dim ..] for every group g < groups: reverses the
// tokens of each stride group, the query side of antidiagonal scoring.
void reverse_stride_groups(const float* rows, int64_t groups, int64_t stride, int64_t dim, float* out);

// Antidiagonal block mass of `num_rows` query groups (rows, num_rows × width, already reversed)
// against `num_columns` key groups (columns, num_columns × width): for each row, softmax over all
// columns of dot · scale, and mass[column_block[j]] += probability of column j (accumulated in
// double). column_block has num_columns entries, each in [0, mass.size()).
void add_antidiagonal_mass(const float* rows, int64_t num_rows, const float* columns, int64_t num_columns,
                           int64_t width, float scale, std::span<const int32_t> column_block, std::span<double> mass);

// `candidates` sorted by score descending, index ascending on ties.
void sort_by_score(const float* score, std::vector<int32_t>& candidates);

// τ selection over n blocks: keep[c] = 1 blocks already count with their score; then the highest
// of the others are added while the kept score is below target.
void keep_until_mass(const float* score, int64_t n, double target, uint8_t* keep);

// Number of leading entries of `ordered` (sorted by sort_by_score) that cdf selection keeps: the
// smallest n >= 1 whose scores sum (in fp32) to >= p; all of them when they never do.
int64_t cdf_count(const float* score, std::span<const int32_t> ordered, double p);

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
