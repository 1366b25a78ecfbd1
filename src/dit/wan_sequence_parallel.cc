// The Wan transformer's sequence-parallel pieces (see wan_sequence_parallel.h).
#include "wan_sequence_parallel.h"

#include "tessel/dit/ops.h"
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
                                         int64_t head_dim, const std::vector<std::shared_ptr<SparseAttention>>& modules,
                                         DType dtype, Device device)
    : sequence_group_(*groups.sequence),
      batch_(batch),
      seq_(seq),
      heads_(heads),
      head_dim_(head_dim),
      dtype_(dtype),
      device_(device),
      part_(groups.coordinates.sequence) {
  const auto [block_q, block_kv] = shared_mask_blocks(modules);
  mask_block_kv_ = block_kv;
  ParallelAttentionShape shape;
  shape.batch = batch;
  shape.seq = seq;
  shape.heads = shape.kv_heads = heads;
  shape.head_dim = head_dim;
  shape.dtype = dtype;
  shape.device = device;
  shape.mask_block_q = block_q;
  shape.mask_block_kv = block_kv;
  attention_ = std::make_unique<ParallelAttention>(groups, shape);
}

TensorView WanSequenceParallel::rows(const void* data, DType dtype, int64_t tokens, int64_t width) const {
  return TensorView(const_cast<void*>(data), dtype, device_, {batch_, tokens, width});
}

TensorView WanSequenceParallel::heads(void* data, int64_t tokens) const {
  return TensorView(data, dtype_, device_, {batch_, tokens, heads_, head_dim_});
}

void WanSequenceParallel::take_rows(const ExecContext& ctx, const void* full, DType dtype, int64_t width, void* shard) const {
  take_shard(ctx, sharding(), part_, rows(full, dtype, seq_, width), rows(shard, dtype, shard_length(), width));
}

void WanSequenceParallel::gather_rows(const ExecContext& ctx, const void* shard, DType dtype, int64_t width, void* full) const {
  const TensorView shard_view = rows(shard, dtype, shard_length(), width);
  const size_t bytes = gather_staging_bytes(sharding(), shard_view);
  if (!staging_.defined() || staging_.nbytes() < bytes)
    staging_ = Tensor::empty({static_cast<int64_t>(bytes)}, DType::kU8, device_);
  const TensorView staging(staging_.data(), dtype, device_, {static_cast<int64_t>(bytes / dtype_size(dtype))});
  gather_shards(ctx, sequence_group_, sharding(), shard_view, staging, rows(full, dtype, seq_, width));
}

void WanSequenceParallel::rotate(const ExecContext& ctx, float* x, const float* cos, const float* sin) const {
  const int64_t half = head_dim_ / 2, row = heads_ * head_dim_;
  for (int64_t b = 0; b < batch_; ++b)
    dit::rotate_pairs(ctx, x + b * shard_length() * row, 1, valid_tokens(), heads_, head_dim_, cos + first_token() * half,
                      sin + first_token() * half);
}

std::shared_ptr<const ParallelMaskPlan> WanSequenceParallel::plan_for(int64_t layer, BlockMask mask) {
  PlannedMask& slot = plans_[layer];
  const bool same = slot.plan && slot.mask.shape() == mask.shape() && slot.mask.indptr() == mask.indptr() &&
                    slot.mask.indices() == mask.indices();
  if (!same) slot = PlannedMask{std::move(mask), nullptr};
  if (!slot.plan) slot.plan = attention_->plan_mask(slot.mask);
  return slot.plan;
}

AttentionStepReport WanSequenceParallel::attend(const ExecContext& ctx, const SparseAttention* module, const StepInfo& step,
                                                void* q, void* k, void* v, void* out) {
  if (timeline_ != nullptr) timeline_->mark(ctx, "outside attention");
  const int64_t tokens = shard_length();
  // One shard holds the whole sequence and every head (a CFG-parallel-only layout, a world of
  // one): the module runs as without groups, masks estimated on the device included.
  if (module != nullptr && shards() == 1)
    return module->forward(ctx, step, heads(q, tokens), heads(k, tokens), heads(v, tokens), heads(out, tokens));
  AttentionStepReport report;
  // Ulysses alone and a mask estimated from q and k: after the all-to-all each rank holds every
  // token of its heads and runs the module on them as on one device (per-head estimators: the
  // same rows as the whole mask), the mask estimated and used on the device, instead of gathering
  // the whole q and k to every rank and copying the mask through the host.
  if (module != nullptr && attention_->strategy() == ParallelStrategy::kUlysses && module->adapter().backend()) {
    const PatternType type = module->adapter().config().pattern().type;
    if (type == PatternType::kDynamicTopk || type == PatternType::kThreshold) {
      attention_->forward_with_local_attention(
          ctx, heads(q, tokens), heads(k, tokens), heads(v, tokens), heads(out, tokens),
          [&](const TensorView& q_heads, const TensorView& k_heads, const TensorView& v_heads, const TensorView& out_heads) {
            if (q_heads.is_contiguous()) {
              report = module->forward(ctx, step, q_heads, k_heads, v_heads, out_heads);
              return;
            }
            // Padded shards (the sequence does not divide): the mask from the module on these
            // views, the kernels on the strided rows.
            const AttentionShape local = AttentionShape::of(q_heads, k_heads, v_heads);
            const std::optional<BlockMask> mask =
                module->adapter().executed_mask(ctx, step, local, [&] { return std::pair{q_heads, k_heads}; });
            if (!mask) {
              attention_forward(ctx, q_heads, k_heads, v_heads, out_heads, TensorView{});
              return;
            }
            report.backend = module->adapter().backend()->name();
            report.dense = false;
            report.density = mask->density();
            if (device_.is_cuda()) {
              const BlockMask::DeviceCopy copy = mask->to_device(device_);
              block_sparse_attention_forward(ctx, q_heads, k_heads, v_heads, copy.view(), out_heads, TensorView{});
            } else {
              block_sparse_attention_forward(ctx, q_heads, k_heads, v_heads, mask->view(), out_heads, TensorView{});
            }
          });
      return report;
    }
  }
  // Ring alone and a top-k mask on CUDA: a row's estimate reads its own queries and every key, so
  // each rank estimates the rows of its query shard on the device from its q and the gathered k
  // (q is not gathered), and the mask is cut per ring step on the device: nothing goes through the
  // host. The threshold estimator (its strided query sampling and chunk padding are not shown to be
  // free of the rows' position) and USP keep the gathered path below.
  if (module != nullptr && device_.is_cuda() && attention_->strategy() == ParallelStrategy::kRing &&
      module->adapter().backend() && module->adapter().config().pattern().type == PatternType::kDynamicTopk &&
      !module->adapter().config().pattern().keep_diagonal) {
    if (!global_k_.defined()) global_k_ = Tensor::empty({batch_, seq_, heads_, head_dim_}, dtype_, device_);
    const int64_t row = heads_ * head_dim_;
    const TensorView q_rows(q, dtype_, device_, {batch_, valid_tokens(), heads_, head_dim_},
                            {tokens * row, row, head_dim_, 1});
    std::optional<DeviceMaskEstimate> rows;
    if (module->adapter().density_at(step) < 1.0) {  // the same on every rank: the gather is collective
      gather_rows(ctx, k, dtype_, row, global_k_.data());
      if (valid_tokens() > 0) {
        rows = module->adapter().estimate_rows_on_device(ctx, step, q_rows, heads(global_k_.data(), seq_));
      } else {  // a shard of padding only (fewer tokens than ranks): no rows, nothing to estimate
        const PatternSpec& spec = module->adapter().config().pattern();
        BlockMaskView none;
        none.mask_batch = batch_;
        none.mask_heads = heads_;
        none.block_q = spec.block_q;
        none.block_kv = spec.block_kv;
        none.seq_kv = seq_;
        none.kv_blocks = (seq_ + spec.block_kv - 1) / spec.block_kv;
        none.device = device_;
        rows = DeviceMaskEstimate{none, ForwardStats{0.0, 0.0}};
      }
    }
    if (!rows) {
      attention_->forward(ctx, heads(q, tokens), heads(k, tokens), heads(v, tokens), heads(out, tokens));
      return report;
    }
    report.backend = module->adapter().backend()->name();
    report.dense = false;
    report.density = rows->stats.density;
    attention_->forward_with_rows_mask(ctx, heads(q, tokens), heads(k, tokens), heads(v, tokens), heads(out, tokens),
                                       rows->view);
    return report;
  }
  std::optional<BlockMask> mask;
  if (module != nullptr) {
    AttentionShape global{batch_, heads_, heads_, head_dim_, seq_, seq_, dtype_, device_};
    mask = module->adapter().executed_mask(ctx, step, global, [&] {
      // A data-dependent mask: every rank estimates it from the whole q and k (the same on all:
      // the gathered tensors are bit for bit alike and the estimators are deterministic).
      const Shape whole{batch_, seq_, heads_, head_dim_};
      if (!global_q_.defined()) {
        global_q_ = Tensor::empty(whole, dtype_, device_);
        global_k_ = Tensor::empty(whole, dtype_, device_);
      }
      gather_rows(ctx, q, dtype_, heads_ * head_dim_, global_q_.data());
      gather_rows(ctx, k, dtype_, heads_ * head_dim_, global_k_.data());
      return std::pair{heads(global_q_.data(), seq_), heads(global_k_.data(), seq_)};
    });
  }
  std::shared_ptr<const ParallelMaskPlan> plan;
  if (mask) {
    report.backend = module->adapter().backend()->name();
    report.dense = false;
    report.density = mask->density();
    plan = plan_for(step.layer, std::move(*mask));
  }
  attention_->forward(ctx, heads(q, tokens), heads(k, tokens), heads(v, tokens), heads(out, tokens), plan.get());
  return report;
}

}  // namespace tessel
