#include "token_permutation.h"

#include <cstring>

#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"

namespace tessel {

void check_permutation(const std::vector<int64_t>& permutation, const AttentionShape& shape, const std::string& who) {
  if (shape.seq_q != shape.seq_kv)
    fail_argument(who, "seq_q == seq_kv (permutations are for self attention)",
                  std::to_string(shape.seq_q) + " vs " + std::to_string(shape.seq_kv));
  if (static_cast<int64_t>(permutation.size()) != shape.seq_q)
    fail_argument(who + " length", shape.seq_q, permutation.size());
  std::vector<uint8_t> seen(permutation.size(), 0);
  for (size_t i = 0; i < permutation.size(); ++i) {
    const int64_t t = permutation[i];
    if (t < 0 || t >= shape.seq_q || seen[static_cast<size_t>(t)])
      fail_argument(who + "[" + std::to_string(i) + "]", "a token in [0, seq) used once", t);
    seen[static_cast<size_t>(t)] = 1;
  }
}

std::vector<int64_t> invert_permutation(const std::vector<int64_t>& permutation) {
  std::vector<int64_t> inverse(permutation.size());
  for (size_t i = 0; i < permutation.size(); ++i) inverse[static_cast<size_t>(permutation[i])] = static_cast<int64_t>(i);
  return inverse;
}

void gather_along_axis(const TensorView& src, const TensorView& dst, int64_t axis, const std::vector<int64_t>& index) {
  check_device(src, Device::cpu(), "gather source");
  check_device(dst, Device::cpu(), "gather destination");
  check_dtype(dst, src.dtype(), "gather destination");
  check_shape(dst, src.shape(), "gather destination");
  if (static_cast<int64_t>(index.size()) != src.size(axis)) fail_argument("gather index length", src.size(axis), index.size());
  const int64_t rank = src.dim();
  const size_t elem = dtype_size(src.dtype());
  const bool inner_contiguous = axis != rank - 1 && src.stride(rank - 1) == 1 && dst.stride(rank - 1) == 1;
  const int64_t inner = inner_contiguous ? src.size(rank - 1) : 1;
  const int64_t outer_rank = inner_contiguous ? rank - 1 : rank;
  std::vector<int64_t> position(static_cast<size_t>(outer_rank), 0);
  auto* src_bytes = static_cast<const char*>(src.data());
  auto* dst_bytes = static_cast<char*>(dst.data());
  const int64_t count = src.numel() / inner;
  for (int64_t n = 0; n < count; ++n) {
    int64_t src_offset = 0, dst_offset = 0;
    for (int64_t d = 0; d < outer_rank; ++d) {
      const int64_t p = position[static_cast<size_t>(d)];
      src_offset += (d == axis ? index[static_cast<size_t>(p)] : p) * src.stride(d);
      dst_offset += p * dst.stride(d);
    }
    std::memcpy(dst_bytes + dst_offset * static_cast<int64_t>(elem), src_bytes + src_offset * static_cast<int64_t>(elem),
                elem * static_cast<size_t>(inner));
    for (int64_t d = outer_rank - 1; d >= 0; --d) {
      if (++position[static_cast<size_t>(d)] < src.size(d)) break;
      position[static_cast<size_t>(d)] = 0;
    }
  }
}

size_t permuted_attention_workspace_bytes(const ExecContext& ctx, const AttentionShape& shape, int64_t block_kv,
                                          bool with_lse) {
  const size_t elem = dtype_size(shape.dtype);
  const auto bytes = [&](int64_t seq, int64_t heads) {
    return workspace_slice_bytes(static_cast<size_t>(shape.batch * seq * heads * shape.head_dim) * elem);
  };
  const size_t lse = with_lse ? workspace_slice_bytes(static_cast<size_t>(shape.batch * shape.num_qo_heads * shape.seq_q) *
                                                      sizeof(float))
                              : 0;
  const AttentionDims dims{shape.batch, shape.seq_q, shape.seq_kv, shape.num_qo_heads, shape.num_kv_heads, shape.head_dim};
  return 2 * bytes(shape.seq_q, shape.num_qo_heads) + 2 * bytes(shape.seq_kv, shape.num_kv_heads) + lse +
         attention_workspace_bytes(ctx, Device::cpu(), dims, block_kv);
}

void permuted_block_sparse_attention(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                                     const BlockMaskView& mask, const std::vector<int64_t>& permutation,
                                     const std::vector<int64_t>& inverse_permutation, const TensorView& out,
                                     const TensorView& lse) {
  check_device(q, Device::cpu(), "q (token permutation)");
  check_shape(out, q.shape(), "out");
  check_dtype(out, q.dtype(), "out");
  check_device(out, q.device(), "out");
  if (!lse.empty()) {
    check_shape(lse, {q.size(0), q.size(2), q.size(1)}, "lse");
    check_dtype(lse, DType::kF32, "lse");
    check_device(lse, q.device(), "lse");
  }
  Workspace own;
  const Workspace* workspace = ctx.workspace;
  if (workspace == nullptr) {
    own.reserve(permuted_attention_workspace_bytes(ctx, AttentionShape::of(q, k, v), mask.block_kv, !lse.empty()));
    workspace = &own;
  }
  if (!workspace->device().is_cpu())
    fail_argument("ctx.workspace", "host memory for the token permutation", workspace->device().str());
  WorkspaceSlicer slicer(*workspace);
  const auto slice = [&](const TensorView& like, const char* what) {
    return TensorView(slicer.take_bytes(like.nbytes(), what), like.dtype(), Device::cpu(), like.shape());
  };
  const TensorView pq = slice(q, "permuted q"), pk = slice(k, "permuted k"), pv = slice(v, "permuted v");
  const TensorView pout = slice(out, "permuted out");
  const TensorView plse = lse.empty() ? TensorView{} : slice(lse, "permuted lse");
  gather_along_axis(q, pq, 1, permutation);
  gather_along_axis(k, pk, 1, permutation);
  gather_along_axis(v, pv, 1, permutation);
  Workspace rest = slicer.rest();
  block_sparse_attention_forward(ctx.with_workspace(&rest), pq, pk, pv, mask, pout, plse);
  // Token t of the caller's order sits at position inverse[t] of the permuted one.
  gather_along_axis(pout, out, 1, inverse_permutation);
  if (!lse.empty()) gather_along_axis(plse, lse, 2, inverse_permutation);
}

}  // namespace tessel
