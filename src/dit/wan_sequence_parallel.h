// The Wan transformer under sequence parallelism: what one forward needs to run its whole block
// stack on this rank's shard of the tokens, on the CPU (fp32) or a CUDA device (bf16 attention).
//
// Every rank patchifies the whole latent but keeps only its shard of token rows (B, shard_length,
// ...), padding rows zeroed; norms, GEMMs, the FFN and the cross-attention to the (replicated) text
// run on those rows alone. The self-attention goes through ParallelAttention (Ulysses, Ring or USP
// by the groups' degrees); RoPE rotates each row by its global position; the projected output
// patches are gathered over the sequence group so that every rank unpatchifies the whole output.
// Padding rows carry finite values through the block (never attended to, dropped by the gather).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/parallel/parallel_attention.h"
#include "tessel/sparse/sparse_attention.h"

namespace tessel {

class WanSequenceParallel {
 public:
  // The shard of `seq` tokens this rank holds in `groups` (its sequence coordinate), for batch
  // `batch` and `heads` x `head_dim` self-attention of `dtype` on `device` (the communicators'
  // device). `modules` are the blocks' sparse modules (empty: dense); under Ring every block that
  // may run sparse must use the same block sizes.
  WanSequenceParallel(const ParallelGroups& groups, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                      const std::vector<std::shared_ptr<SparseAttention>>& modules, DType dtype = DType::kF32,
                      Device device = Device::cpu());

  // Whether this object serves a forward of these sizes (a model keeps one across its forwards).
  bool serves(int64_t batch, int64_t seq) const { return batch == batch_ && seq == seq_; }
  int64_t shards() const { return sharding().parts; }
  int64_t shard_length() const { return sharding().shard_length; }
  int64_t first_token() const { return sharding().begin(part_); }
  int64_t valid_tokens() const { return sharding().valid(part_); }
  // The kv block size of the blocks' masks (0: every block dense), for sizing the workspace.
  int64_t mask_block_kv() const { return mask_block_kv_; }

  // full (B, seq, width) -> this rank's rows (B, shard_length, width), padding rows zero; both of
  // `dtype` on this object's device.
  void take_rows(const ExecContext& ctx, const void* full, DType dtype, int64_t width, void* shard) const;
  void take_rows(const ExecContext& ctx, const float* full, int64_t width, float* shard) const {
    take_rows(ctx, full, DType::kF32, width, shard);
  }
  // The inverse over the sequence group: every rank gets all rows (padding dropped).
  void gather_rows(const ExecContext& ctx, const void* shard, DType dtype, int64_t width, void* full) const;
  void gather_rows(const ExecContext& ctx, const float* shard, int64_t width, float* full) const {
    gather_rows(ctx, shard, DType::kF32, width, full);
  }
  // CPU: dit::rotate_pairs of this rank's real rows of x (B, shard_length, heads, head_dim) with
  // the rows of the global RoPE tables (seq, head_dim / 2) at their global positions.
  void rotate(const ExecContext& ctx, float* x, const float* cos, const float* sin) const;

  // Self-attention of one block on this rank's rows q, k, v, out (B, shard_length, heads,
  // head_dim) of the attention dtype: dense, or with the block mask `module` would execute on the
  // global sequence at `step` (data-dependent masks are estimated on q and k gathered from every
  // rank; on CUDA only static masks are supported).
  AttentionStepReport attend(const ExecContext& ctx, const SparseAttention* module, const StepInfo& step, void* q, void* k,
                             void* v, void* out);

  // Benchmarks: each attend() marks "outside attention" (the work since the previous mark: the
  // rest of the block) and the attention's phases (ParallelAttention::set_timeline) on `timeline`,
  // after the caller's begin(); null stops it.
  void set_timeline(PhaseTimeline* timeline) {
    timeline_ = timeline;
    attention_->set_timeline(timeline);
  }

 private:
  const SequenceSharding& sharding() const { return attention_->sharding(); }
  TensorView rows(const void* data, DType dtype, int64_t tokens, int64_t width) const;
  TensorView heads(void* data, int64_t tokens) const;
  // This rank's slices of `mask`, reused while a block's mask stays the same (a static pattern's
  // is the same every step): planning copies the slices to the device.
  std::shared_ptr<const ParallelMaskPlan> plan_for(int64_t layer, BlockMask mask);

  Communicator& sequence_group_;
  int64_t batch_, seq_, heads_, head_dim_;
  DType dtype_;
  Device device_;
  int64_t part_;
  int64_t mask_block_kv_ = 0;
  std::unique_ptr<ParallelAttention> attention_;
  mutable Tensor staging_;                  // gather_shards' scratch, grown to the largest gather
  Tensor global_q_, global_k_;              // data-dependent masks: the gathered q and k (k alone: Ring's device top-k)
  struct PlannedMask {
    BlockMask mask;
    std::shared_ptr<const ParallelMaskPlan> plan;
  };
  std::map<int64_t, PlannedMask> plans_;  // by block index
  PhaseTimeline* timeline_ = nullptr;
};

}  // namespace tessel
