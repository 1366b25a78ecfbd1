// Internal: token reordering for planners that permute the sequence (spatial_aware). The mask is
// planned over the permuted order; q/k/v are gathered into it and out/lse scattered back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/core/tensor.h"
#include "tessel/kernels/block_mask_view.h"
#include "tessel/sparse/backend.h"

namespace tessel {

// Throws Error (named `who`) unless seq_q == seq_kv and `permutation` is a permutation of [0, seq).
void check_permutation(const std::vector<int64_t>& permutation, const AttentionShape& shape, const std::string& who);
std::vector<int64_t> invert_permutation(const std::vector<int64_t>& permutation);

// dst[..., i, ...] = src[..., index[i], ...] along `axis` (CPU views of equal shape and dtype).
void gather_along_axis(const TensorView& src, const TensorView& dst, int64_t axis, const std::vector<int64_t>& index);

// Workspace bytes permuted_block_sparse_attention takes: the gathered q, k, v, out (and lse when
// with_lse) plus the attention's own scratch for masks of block_kv-token kv blocks.
size_t permuted_attention_workspace_bytes(const ExecContext& ctx, const AttentionShape& shape, int64_t block_kv,
                                          bool with_lse);

// Block-sparse attention where token t of the permuted sequence is token permutation[t] of the
// caller's: gathers q/k/v, attends with `mask` (permuted order), scatters out and lse back. The
// gathered copies live in ctx.workspace (one of this call's own when it has none). CPU only.
// Validates out/lse before writing them.
void permuted_block_sparse_attention(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                                     const BlockMaskView& mask, const std::vector<int64_t>& permutation,
                                     const std::vector<int64_t>& inverse_permutation, const TensorView& out,
                                     const TensorView& lse);

}  // namespace tessel
