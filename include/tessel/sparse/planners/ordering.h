// Token orderings for spatial-aware attention. Reordering the latent patches of each frame along
// a space-filling curve makes 2-D neighbourhoods land in few contiguous token blocks, so a
// block-sparse kernel can keep them with few blocks. The plan carries the permutation; backends
// gather q/k/v into the new order and scatter the output back, so callers never see it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/tensor.h"
#include "tessel/sparse/pattern.h"  // SpatialOrdering
#include "tessel/sparse/planners/token_layout.h"

namespace tessel {

// order[new_position] = original token; inverse[original token] = new_position.
struct TokenPermutation {
  std::vector<int32_t> order;
  std::vector<int32_t> inverse;

  int64_t size() const { return static_cast<int64_t>(order.size()); }
  bool is_identity() const;
  bool operator==(const TokenPermutation&) const = default;
};

// The permutation of the whole sequence of `layout`: text tokens keep their positions; frames stay
// in order, and within each frame the height × width patches follow the curve:
//   raster  — row-major (the identity);
//   hilbert — the 2-D Hilbert curve over the smallest 2^k × 2^k square covering the frame,
//             visiting cells in curve order and skipping cells outside height × width;
//   z_curve — Morton order: cells sorted by the bit interleave of (row, column), row bit higher.
TokenPermutation make_token_permutation(const TokenLayout& layout, SpatialOrdering ordering);

// Checks that order and inverse are mutually inverse permutations of [0, n). Throws Error.
void validate_token_permutation(const TokenPermutation& permutation, int64_t n, const std::string& argument);

// dst[:, p] = src[:, order[p]] along the sequence axis (axis 1) of BSHD CPU views (any strides) of
// the same shape and dtype. src and dst must not alias.
void permute_tokens(const TensorView& src, const TensorView& dst, const TokenPermutation& permutation);
// The inverse: dst[:, order[p]] = src[:, p].
void unpermute_tokens(const TensorView& src, const TensorView& dst, const TokenPermutation& permutation);

}  // namespace tessel
