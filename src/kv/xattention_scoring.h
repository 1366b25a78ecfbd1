// Internal: XAttention-BSA block selection in two parts (see policies.h for the algorithm).
//   Scoring: for every (query head h, query block qb, history block b), the softmax mass that the
//   strided query rows of qb give to the columns of b, on the host (reading the host cache) or on
//   the device (over the history keys copied up by OffloadEngine::load_keys).
//   Selection: one rule over those masses, used by both scorers, so that the same masses select
//   the same blocks.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tessel/kv/sparse_policy.h"

namespace tessel::kv {

// Shapes of one select_blocks call.
struct XAttentionGeometry {
  int64_t stride = 0;
  int64_t heads = 0, kv_heads = 0, dim = 0;
  int64_t block_size = 0;
  int64_t q_rows = 0;           // reshaped query rows scored: floor(chunk / stride); a shorter tail is not
  int64_t rows_per_qblock = 0;  // block_size / stride: a query block is block_size tokens
  int64_t q_blocks = 0;         // ceil(q_rows / rows_per_qblock)
  int64_t blocks = 0;           // history blocks
  float scale = 0;              // logit scale of a reshaped row · column: 1/sqrt(dim) / stride
  // Reshaped query rows of query block qb (the mass its row of masses sums to).
  int64_t rows_in(int64_t qb) const;
  // Entries of the mass grid: heads * q_blocks * blocks.
  int64_t mass_size() const { return heads * q_blocks * blocks; }
};

// Validates the query (1, S_q, H_q, D) against the engine and stride.
XAttentionGeometry xattention_geometry(const OffloadConfig& config, const TensorView& query, int64_t stride,
                                       int64_t blocks);

// Masses (heads, q_blocks, blocks) row-major: mass[(h * q_blocks + qb) * blocks + b] is the sum over
// the reshaped rows of query block qb of their softmax mass in history block b. A block's columns are
// its block_tokens / stride whole groups; the softmax runs over all history columns.
std::vector<float> score_on_host(OffloadEngine& engine, const PolicyContext& ctx, std::span<const int32_t> available,
                                 const XAttentionGeometry& g, SelectionStats& stats);

// Empty when score_on_device can score this call, else why not (CPU engine, fp32, query not on the
// device, shapes the device kernels do not support, tessel built without CUDA).
std::string device_scoring_unavailable(const OffloadEngine& engine, const PolicyContext& ctx,
                                       const XAttentionGeometry& g);
std::vector<float> score_on_device(OffloadEngine& engine, const PolicyContext& ctx, std::span<const int32_t> available,
                                   const XAttentionGeometry& g, SelectionStats& stats);

// The selection: each (h, qb) keeps its heaviest blocks (ties: lower index first) until their mass
// reaches threshold × rows_in(qb); a kv head keeps a block when any query head of its group does; a
// block is selected when more than vote_threshold of the (kv head, query block) pairs keep it; the
// first and last blocks always are. Returns the selected history indices, ascending.
std::vector<int64_t> select_from_block_masses(std::span<const float> mass, const XAttentionGeometry& g,
                                              double threshold, double vote_threshold);

}  // namespace tessel::kv
