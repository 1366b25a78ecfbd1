// The Wan transformer's sequence-parallel pieces (see wan_sequence_parallel.h).
#include "wan_sequence_parallel.h"

#include "ops.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {

// The block sizes every block that may run sparse shares (0 x 0 when all are dense): ParallelAttention
// aligns the shards to them under Ring, once for the whole block stack.
std::pair<int64_t, int64_t> shared_mask_blocks(const std::vector<std::shared_ptr<SparseAttention>>& modules) {
  std::pair<int64_t, int64_t> blocks{0, 0};
  for (const auto& module : modules) {
    if (!module->adapter().backend()) continue;
    const PatternSpec& spec = module->adapter().config().pattern();
    const std::pair<int64_t, int64_t> own{spec.block_q, spec.block_kv};
    if (blocks.first != 0 && own != blocks)
      fail_argument(detail::concat("block sizes of block ", module->adapter().layer_index(), "'s sparse attention"),
                    detail::concat(blocks.first, " x ", blocks.second, " (one size for every block under sequence parallelism)"),
                    detail::concat(own.first, " x ", own.second));
    blocks = own;
  }
  return blocks;
}

}  // namespace

WanSequenceParallel::WanSequenceParallel(const ParallelGroups& groups, int64_t batch, int64_t seq, int64_t heads,
                                         int64_t head_dim, const std::vector<std::shared_ptr<SparseAttention>>& modules)
    : sequence_group_(*groups.sequence),
      batch_(batch),
      seq_(seq),
      heads_(heads),
      head_dim_(head_dim),
      part_(groups.coordinates.sequence) {
  const auto [block_q, block_kv] = shared_mask_blocks(modules);
  mask_block_kv_ = block_kv;
  ParallelAttentionShape shape;
  shape.batch = batch;
  shape.seq = seq;
  shape.heads = shape.kv_heads = heads;
  shape.head_dim = head_dim;
  shape.dtype = DType::kF32;
  shape.device = Device::cpu();
  shape.mask_block_q = block_q;
  shape.mask_block_kv = block_kv;
  attention_ = std::make_unique<ParallelAttention>(groups, shape);
}

TensorView WanSequenceParallel::rows(const float* data, int64_t tokens, int64_t width) const {
  return TensorView(const_cast<float*>(data), DType::kF32, Device::cpu(), {batch_, tokens, width});
}

TensorView WanSequenceParallel::heads(float* data, int64_t tokens) const {
  return TensorView(data, DType::kF32, Device::cpu(), {batch_, tokens, heads_, head_dim_});
}

void WanSequenceParallel::take_rows(const ExecContext& ctx, const float* full, int64_t width, float* shard) const {
  take_shard(ctx, sharding(), part_, rows(full, seq_, width), rows(shard, shard_length(), width));
}

void WanSequenceParallel::gather_rows(const ExecContext& ctx, const float* shard, int64_t width, float* full) const {
  const TensorView shard_view = rows(shard, shard_length(), width);
  staging_.resize(gather_staging_bytes(sharding(), shard_view) / sizeof(float));
  const TensorView staging(staging_.data(), DType::kF32, Device::cpu(), {static_cast<int64_t>(staging_.size())});
  gather_shards(ctx, sequence_group_, sharding(), shard_view, staging, rows(full, seq_, width));
}

void WanSequenceParallel::rotate(const ExecContext& ctx, float* x, const float* cos, const float* sin) const {
  const int64_t half = head_dim_ / 2, row = heads_ * head_dim_;
  for (int64_t b = 0; b < batch_; ++b)
    dit::rotate_pairs(ctx, x + b * shard_length() * row, 1, valid_tokens(), heads_, head_dim_, cos + first_token() * half,
                      sin + first_token() * half);
}

AttentionStepReport WanSequenceParallel::attend(const ExecContext& ctx, const SparseAttention* module, const StepInfo& step,
                                                float* q, float* k, float* v, float* out) {
  const int64_t tokens = shard_length();
  AttentionStepReport report;
  std::optional<BlockMask> mask;
  if (module != nullptr) {
    AttentionShape global{batch_, heads_, heads_, head_dim_, seq_, seq_, DType::kF32, Device::cpu()};
    mask = module->adapter().executed_mask(ctx, step, global, [&] {
      // A data-dependent mask: every rank estimates it from the whole q and k (the same on all).
      global_q_.resize(static_cast<size_t>(batch_ * seq_ * heads_ * head_dim_));
      global_k_.resize(global_q_.size());
      gather_rows(ctx, q, heads_ * head_dim_, global_q_.data());
      gather_rows(ctx, k, heads_ * head_dim_, global_k_.data());
      return std::pair{heads(global_q_.data(), seq_), heads(global_k_.data(), seq_)};
    });
  }
  std::shared_ptr<const ParallelMaskPlan> plan;
  if (mask) {
    plan = attention_->plan_mask(*mask);
    report.backend = module->adapter().backend()->name();
    report.dense = false;
    report.density = mask->density();
  }
  attention_->forward(ctx, heads(q, tokens), heads(k, tokens), heads(v, tokens), heads(out, tokens), plan.get());
  return report;
}

}  // namespace tessel
