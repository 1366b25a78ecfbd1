// Sequence-parallel attention: every rank of a sequence-parallel group holds one shard of the
// tokens (SequenceSharding, shard index = the rank's sequence coordinate) and gets its shard of
// the output of attention over the whole sequence.
//
//   Ulysses (U ranks)  all-to-all: (B, S/U, H, D) -> (B, S, H/U, D), attention over the whole
//                      sequence for H/U heads, all-to-all back. Needs U | H and U | H_kv.
//   Ring    (R ranks)  each rank keeps its query shard; the K/V shards travel around the ring (the
//                      next one in flight while the current one is attended to) and the partial
//                      outputs are merged by their LSE (merge_attention_states).
//   USP     (U x R)    Ulysses inside each ring position, Ring across them.
//   local   (1 rank)   plain attention.
// Ulysses alone with ParallelConfig::ulysses_head_groups G > 1 pipelines G groups of each rank's
// heads: the q/k/v all-to-all of every group is issued at once on the communicator's own stream
// (Communicator::all_to_all_async), group g's attention waits only for its own, and its output's
// all-to-all runs while group g+1 attends. The same per-head attention: the same bits as G = 1.
// Block-sparse attention composes with all of them: the mask is planned for the global sequence
// (plan_mask) and every rank attends with the slice of it that matches its heads, its query shard
// and the key shard of each ring step; steps whose slice keeps no block are skipped. Padding tokens
// (when the sequence does not divide) are never attended to and come out as zeros.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "tessel/kernels/attention.h"
#include "tessel/parallel/parallel_config.h"
#include "tessel/parallel/phase_timeline.h"
#include "tessel/parallel/sequence_sharding.h"
#include "tessel/sparse/block_mask.h"

namespace tessel {

enum class ParallelStrategy { kLocal, kUlysses, kRing, kUsp };
std::string_view parallel_strategy_name(ParallelStrategy strategy);  // "local", "ulysses", "ring", "usp"

struct ParallelAttentionShape {
  int64_t batch = 1;
  int64_t seq = 0;  // global tokens (queries and keys: self-attention)
  int64_t heads = 1, kv_heads = 1, head_dim = 0;
  DType dtype = DType::kF32;
  Device device{};
  // Block sizes of the masks forward() will be given; 0 = dense only. Under Ring the shards are
  // aligned to both.
  int64_t mask_block_q = 0, mask_block_kv = 0;
};

// One rank's slices of a global block mask (one per ring step), on the attention's device.
// Immutable: plan once per mask, share across calls and threads.
class ParallelMaskPlan {
 public:
  struct Step {
    BlockMask mask;              // the slice, on the host (empty for a slice cut on the device)
    BlockMask::DeviceCopy copy;  // CUDA attention only
    BlockMaskView view;
    bool has_blocks = false;     // false: the step attends to nothing and is skipped
  };
  const std::vector<Step>& steps() const { return steps_; }

 private:
  friend class ParallelAttention;
  std::vector<Step> steps_;
  // ulysses_head_groups > 1: the one step of each head group, its slice cut to the group's heads.
  std::vector<std::vector<Step>> head_group_steps_;
};

class ParallelAttention {
 public:
  // Plans the strategy for `groups` (its Ulysses and Ring communicators, which must outlive this
  // object and move tensors of shape.device) and allocates its buffers. Throws Error naming the
  // argument when the Ulysses degree does not divide the heads or the kv heads, when
  // groups.config.ulysses_head_groups does not divide the query and the kv heads of a Ulysses rank,
  // when the device is not the communicators', or when options ask for causal or windowed
  // attention under Ring.
  ParallelAttention(const ParallelGroups& groups, const ParallelAttentionShape& shape, const AttentionOptions& options = {});

  ParallelStrategy strategy() const { return strategy_; }
  // How the caller cuts the token sequence: this rank holds shard groups.coordinates.sequence.
  const SequenceSharding& sharding() const { return sharding_; }

  // This rank's slices of `global_mask`, planned for (shape.seq, shape.seq) tokens with the block
  // sizes given at construction and mask heads 1, heads or kv_heads.
  std::shared_ptr<const ParallelMaskPlan> plan_mask(const BlockMask& global_mask) const;

  // q (B, shard_length, H, D), k and v (B, shard_length, H_kv, D), out like q: this rank's shard
  // (head dim contiguous). mask: null for dense attention. Collective over the Ulysses and Ring
  // groups. Allocates nothing; on CUDA it does not synchronize with the host.
  void forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& out, const ParallelMaskPlan* mask = nullptr);

  // Ulysses alone (no ring): after the all-to-all this rank holds every token of its H/U heads, so
  // attention whose mask is estimated from q and k can run there as on one device, on those heads,
  // instead of estimating on q and k gathered from every rank. `attend` gets this rank's q, k, v
  // and out (B, seq, H/U, D) (the real tokens; views into this object's buffers, contiguous when
  // the shards have no padding) and writes out. Otherwise as forward(). Throws Error naming the
  // strategy for Ring and USP. Runs without head groups whatever ulysses_head_groups says: `attend`
  // is one call of a sparse module per layer (its estimate, plan cache and report cover every head
  // of the rank), which per-group calls would split.
  using LocalAttentionFn =
      std::function<void(const TensorView& q_heads, const TensorView& k_heads, const TensorView& v_heads, const TensorView& out_heads)>;
  void forward_with_local_attention(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& out, const LocalAttentionFn& attend);

  // Ring alone (no Ulysses) with a mask of this rank's query rows only: `rows` is the global mask's
  // rows of this rank's query shard against every key (mask_batch 1 or B, mask heads 1, H_kv or H,
  // seq_q this rank's real tokens, seq_kv shape.seq, the planned block sizes), for instance
  // estimated on the device by this rank alone. On CUDA it is cut per ring step on the device (no
  // copy to the host, no synchronization); on the CPU with slice_block_mask. Otherwise as forward().
  // Throws Error naming the strategy for Ulysses and USP, and naming the field of a mismatched mask.
  void forward_with_rows_mask(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const BlockMaskView& rows);

  // Benchmarks: forward() marks its phases (Ulysses pack / all-to-all / unpack, Ring K/V staging,
  // attention, merge, exchange wait) on `timeline` after the caller's begin(); null stops it.
  void set_timeline(PhaseTimeline* timeline) { timeline_ = timeline; }

 private:
  std::pair<TensorView, TensorView> ulysses_staging(const TensorView& shard, const TensorView& gathered) const;
  void ulysses_to_heads(const ExecContext& ctx, const TensorView& shard, const TensorView& gathered);
  void ulysses_to_sequence(const ExecContext& ctx, const TensorView& gathered, const TensorView& shard);
  void mark(const ExecContext& ctx, std::string_view phase) {
    if (timeline_ != nullptr) timeline_->mark(ctx, phase);
  }
  void check_forward_args(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out) const;
  void exchange_pieces(const ExecContext& ctx, const TensorView& send, const TensorView& recv, const TensorView& source,
                       const TensorView& target);
  void cut_rows_mask_on_device(const ExecContext& ctx, const BlockMaskView& rows, int64_t queries, ParallelMaskPlan& plan);
  void ring_attention(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& out, const std::vector<ParallelMaskPlan::Step>* mask, int sm_margin = 0);
  void ulysses_head_group_pipeline(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const ParallelMaskPlan* mask);

  Communicator& ulysses_;
  Communicator& ring_;
  ParallelAttentionShape shape_;
  AttentionOptions options_;
  ParallelStrategy strategy_;
  SequenceSharding sharding_;
  int64_t chunk_ = 0;  // tokens of one ring position: U shards
  int ulysses_rank_ = 0, ring_rank_ = 0;
  int ring_sm_margin_ = 0;  // ParallelConfig::ring_sm_margin
  int head_groups_ = 1;     // ParallelConfig::ulysses_head_groups
  int ulysses_sm_margin_ = 0;  // ParallelConfig::ulysses_sm_margin
  // Buffers (planned at construction).
  Tensor q_heads_, k_heads_, v_heads_, out_heads_;  // (B, chunk, H/U, D) after the Ulysses all-to-all
  Tensor send_, recv_;                              // all-to-all staging (head groups: q, k and v of every group)
  Tensor kv_ring_[2];                               // (2, B, chunk, H_kv/U, D): K and V travelling together
  Tensor partial_out_, partial_lse_, lse_;          // one ring step's result, and the running LSE
  Tensor first_out_, running_out_;                  // fp16/bf16 only: the first step's result, the fp32 running one
  Tensor ring_mask_slices_;                         // int32: forward_with_rows_mask's per-step CSRs on CUDA
  PhaseTimeline* timeline_ = nullptr;
};

}  // namespace tessel
