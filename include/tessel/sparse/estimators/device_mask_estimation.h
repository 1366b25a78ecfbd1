// Dynamic masks estimated on a CUDA device, for `run` paths that must not synchronize with the
// host (a whole denoising step captured in a CUDA graph). Same definitions as the CPU estimators
// (topk_estimator.h, xattention_estimator.h); the result stays on the device.
//
// DeviceEstimatedMask is allocated once per shape (at plan time): a fixed-capacity CSR
// (indptr: rows + 1, indices: rows × kv_blocks, of which the first indptr[rows] are valid)
// plus the estimator's workspace. Each estimate_*_device call refills it with kernels on
// ctx.stream; view() is valid for the attention kernels right after, in stream order, without
// any copy to the host.
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/kernels/block_mask_view.h"
#include "tessel/sparse/block_mask.h"
#include "tessel/sparse/estimators/topk_estimator.h"
#include "tessel/sparse/estimators/xattention_estimator.h"

namespace tessel {

class DeviceEstimatedMask {
 public:
  DeviceEstimatedMask() = default;
  // shape: mask_batch = B and mask_heads = H_q (what the estimators produce). Throws Error when
  // tessel was built without CUDA or the device is not a CUDA device. xattention_stride > 0 also
  // allocates the threshold estimator's workspace for that stride (it depends on the stride), so
  // the first threshold estimate can be captured in a CUDA graph; with 0 the workspace is
  // allocated by the first threshold estimate (which then must not be inside a capture).
  DeviceEstimatedMask(const BlockMaskShape& shape, int64_t kv_heads, int64_t head_dim, Device device,
                      int64_t xattention_stride = 0);

  const BlockMaskShape& shape() const { return shape_; }
  BlockMaskView view() const;
  // Copies the mask to the host (synchronizes): for tests, inspection and pictures.
  BlockMask to_host() const;
  // The number of kept blocks (indptr[rows]), copied to the host after the work queued on `stream`
  // (synchronizes): a density without copying the whole mask.
  int64_t kept_blocks(StreamHandle stream) const;
  // The row offsets (indptr, rows + 1 values; row (batch, head, q_block) keeps indptr[r + 1] -
  // indptr[r] blocks) copied to the host the same way: per-head densities in one copy.
  std::vector<int32_t> row_offsets(StreamHandle stream) const;

 private:
  friend void estimate_topk_mask_device(const ExecContext&, const TensorView&, const TensorView&,
                                        const TopkEstimatorOptions&, DeviceEstimatedMask&);
  friend void estimate_xattention_mask_device(const ExecContext&, const TensorView&, const TensorView&,
                                              const XAttentionOptions&, DeviceEstimatedMask&);
  BlockMaskShape shape_;
  int64_t kv_heads_ = 0, head_dim_ = 0;
  Device device_{};
  Tensor indptr_, indices_;
  Tensor k_mean_, pooled_q_, similar_q_, pooled_k_, similar_k_, row_counts_, row_blocks_;  // dynamic_topk
  Tensor block_lse2_, mass_, zero_group_mass_;                                      // threshold
  Tensor head_n_topk_, head_value_;  // per-query-head selection values (options.per_head*), H_q each
  void reserve_xattention_workspace(StreamHandle stream, int64_t stride);
};

// dynamic_topk on the device: q (B, S_q, H_q, D), k (B, S_kv, H_kv, D) bf16/fp16 CUDA tensors with
// unit stride along D, D a multiple of 32 up to 256, kv_blocks <= 4096; `mask` allocated for
// (B, H_q, S_q, S_kv, options.block_q, options.block_kv). options.keep.text is ignored.
// options.per_head (one ratio, or cdf value in cdf mode, per query head) is uploaded from the host
// with the launch (an asynchronous copy on ctx.stream; not inside a CUDA graph capture); without it
// there is no host synchronization and no copy.
void estimate_topk_mask_device(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TopkEstimatorOptions& options,
                               DeviceEstimatedMask& mask);

// threshold (XAttention) on the device: q, k as above with D 64 or 128, stride 2..64, block_q and
// block_kv multiples of the stride with block_kv / stride a power of two from 4 to 128 (e.g.
// 128×128 blocks at stride 8 or 16, 128×64 at stride 8 or 16), vote = kNone and gqa_any = false
// (the aggregated forms are CPU-only for now), a power-of-two stride with padding kChunk and at
// most 4096 kv blocks with the padding blocks. `mask` allocated for (B, H_q, S_q, S_kv,
// options.block_q, options.block_kv). options.per_head_threshold is uploaded as options.per_head
// of the top-k estimator is; otherwise no host synchronization. Cost: one pass over the strided
// scores, 1/(2·stride) of dense attention's tensor-core work, plus a (B, H_q, S_q/stride, kv
// blocks) fp32 workspace written once and read twice.
void estimate_xattention_mask_device(const ExecContext& ctx, const TensorView& q, const TensorView& k, const XAttentionOptions& options,
                                     DeviceEstimatedMask& mask);

// nullptr when the device threshold estimator runs (head dim, stride, block sizes), else what it
// needs instead, as a phrase for an error message. The same in builds without CUDA.
const char* xattention_device_limit(int64_t head_dim, int64_t stride, int64_t block_q, int64_t block_kv);

}  // namespace tessel
