// BlockMask: the owning BSR block mask (docs/architecture.md), with validation, density and interop.
// See kernels/block_mask_view.h for the row layout. Validation errors name the row
// (batch, head, q_block) and the offending value.
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/core/tensor.h"
#include "tessel/kernels/block_mask_view.h"

namespace tessel {

struct BlockMaskShape {
  int64_t mask_batch = 1;
  int64_t mask_heads = 1;
  int64_t seq_q = 0;
  int64_t seq_kv = 0;
  int64_t block_q = 128;
  int64_t block_kv = 64;

  // Ceiling divisions that cannot overflow (seq near INT64_MAX); block sizes must be >= 1.
  int64_t q_blocks() const { return seq_q / block_q + (seq_q % block_q != 0); }
  int64_t kv_blocks() const { return seq_kv / block_kv + (seq_kv % block_kv != 0); }
  int64_t num_rows() const { return mask_batch * mask_heads * q_blocks(); }
  bool operator==(const BlockMaskShape&) const = default;
};

// FlashInfer BSR for one (batch, head): indptr (q_blocks + 1), indices (nnz).
struct FlashInferBsr {
  std::vector<int32_t> indptr;
  std::vector<int32_t> indices;
};

// FlexAttention's BlockMask tensors: kv_num_blocks (B_m, H_m, Qb), kv_indices (B_m, H_m, Qb, KVb)
// where the first kv_num_blocks entries of each row are the kept ids and the rest are padding (0).
struct FlexBlockMask {
  std::vector<int32_t> kv_num_blocks;
  std::vector<int32_t> kv_indices;
};

// A view over BSR arrays of `shape` living on `device` (no copy, no validation).
BlockMaskView make_block_mask_view(const BlockMaskShape& shape, const int32_t* indptr, const int32_t* indices,
                                   Device device);

class BlockMask {
 public:
  BlockMask() = default;

  // Validates and takes ownership (CPU). Throws Error naming the first bad row.
  static BlockMask from_csr(const BlockMaskShape& shape, std::vector<int32_t> indptr, std::vector<int32_t> indices);
  static BlockMask from_rows(const BlockMaskShape& shape, const std::vector<std::vector<int32_t>>& rows);
  // dense: (B_m, H_m, Qb, KVb) row-major, nonzero = kept.
  static BlockMask from_dense(const BlockMaskShape& shape, const std::vector<uint8_t>& dense);
  static BlockMask full(const BlockMaskShape& shape);
  // Each row keeps round(density * kv_blocks) blocks (at least 1), chosen at random, always
  // including the diagonal block(s) (the kv blocks overlapping the q block's token range, with
  // bottom-right alignment when seq_q != seq_kv).
  static BlockMask random(const BlockMaskShape& shape, double density, uint64_t seed);

  static BlockMask from_flashinfer(const BlockMaskShape& shape, const std::vector<FlashInferBsr>& per_batch_head);
  static BlockMask from_flex(const BlockMaskShape& shape, const FlexBlockMask& flex);

  std::vector<uint8_t> to_dense() const;
  std::vector<FlashInferBsr> to_flashinfer() const;  // one per (b, h), row-major
  FlexBlockMask to_flex() const;

  const BlockMaskShape& shape() const { return shape_; }
  const std::vector<int32_t>& indptr() const { return indptr_; }
  const std::vector<int32_t>& indices() const { return indices_; }
  int64_t nnz() const { return static_cast<int64_t>(indices_.size()); }
  // Kept blocks / all blocks (counting whole blocks, docs/architecture.md).
  double density() const;
  // Fraction of (query, key) token pairs kept, partial last blocks weighted by their size.
  double token_density() const;
  std::vector<int32_t> row(int64_t batch, int64_t head, int64_t q_block) const;

  // A view of the CPU arrays. For CUDA kernels use to_device().view().
  BlockMaskView view() const;

  // Device copy for CUDA kernels; keeps its own storage.
  struct DeviceCopy {
    Tensor indptr, indices;
    BlockMaskShape shape;
    BlockMaskView view() const;
  };
  DeviceCopy to_device(Device device) const;

  // Throws Error naming the first invalid row (unsorted, duplicate, out of range, bad indptr).
  static void validate(const BlockMaskShape& shape, const std::vector<int32_t>& indptr,
                       const std::vector<int32_t>& indices);

 private:
  BlockMaskShape shape_;
  std::vector<int32_t> indptr_;
  std::vector<int32_t> indices_;
};

}  // namespace tessel
