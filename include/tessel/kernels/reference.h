// fp64 oracle for attention with LSE: slow, written for obviousness, used by tests and by
// `tessel bench` to measure error. It computes any subset of query rows, so a benchmark can
// check a sample of a long sequence. Inputs are CPU views of any float dtype and any strides;
// the result is fp64. Semantics are exactly those of kernels/attention.h.
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/core/tensor.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/block_mask_view.h"

namespace tessel::reference {

struct AttentionResult {
  int64_t batch = 0, heads = 0, head_dim = 0;
  std::vector<int64_t> q_rows;  // the query positions computed, in order
  std::vector<double> out;      // (batch, q_rows.size(), heads, head_dim)
  std::vector<double> lse;      // (batch, heads, q_rows.size()); -inf for rows with no key

  int64_t rows() const { return static_cast<int64_t>(q_rows.size()); }
  double out_at(int64_t b, int64_t r, int64_t h, int64_t d) const {
    return out[static_cast<size_t>(((b * rows() + r) * heads + h) * head_dim + d)];
  }
  double lse_at(int64_t b, int64_t h, int64_t r) const {
    return lse[static_cast<size_t>((b * heads + h) * rows() + r)];
  }
};

// True when query i may attend key j under options' causal/window rules (see AttentionOptions).
bool key_visible(int64_t i, int64_t j, int64_t seq_q, int64_t seq_kv, const AttentionOptions& options);

// True when `mask` (a CPU view) keeps the pair (query i, key j) of query head `head` of batch
// `batch`: key j's block is in the row of i's q block and, when the view has sub_block_bits, the
// pair's bit is set. heads / kv_heads are the attention's head counts (for mask_head_for).
bool block_mask_keeps(const BlockMaskView& mask, int64_t batch, int64_t head, int64_t heads, int64_t kv_heads,
                      int64_t i, int64_t j);

// Dense attention. q_rows: query positions to compute; empty means all of them.
AttentionResult attention(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttentionOptions& options = {}, const std::vector<int64_t>& q_rows = {});

// Attention restricted to the kv blocks `mask` keeps (a CPU view) and, when the view carries
// sub_block_bits, to the token pairs they keep inside those blocks, plus the token rules of options.
AttentionResult block_sparse_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const BlockMaskView& mask, const AttentionOptions& options = {},
                                       const std::vector<int64_t>& q_rows = {});

}  // namespace tessel::reference
