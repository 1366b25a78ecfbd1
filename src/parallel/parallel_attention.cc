// Sequence-parallel attention: Ulysses all-to-all around a ring of K/V shards (USP); Ulysses alone,
// Ring alone and local attention are the cases with a group of one.
#include "tessel/parallel/parallel_attention.h"

#include <algorithm>
#include <numeric>

#include "block_mask_slicing.h"
#include "row_copy.h"
#include "tessel/core/error.h"
#ifdef TESSEL_WITH_CUDA
#include "cuda/ring_mask_slicing.h"
#endif

namespace tessel {

using parallel_detail::contiguous_prefix;
using parallel_detail::copy_rows;
using parallel_detail::narrow;
using parallel_detail::select_first;
using parallel_detail::slice_block_mask;
using parallel_detail::TokenRange;
using parallel_detail::zero_rows;

std::string_view parallel_strategy_name(ParallelStrategy strategy) {
  switch (strategy) {
    case ParallelStrategy::kLocal: return "local";
    case ParallelStrategy::kUlysses: return "ulysses";
    case ParallelStrategy::kRing: return "ring";
    case ParallelStrategy::kUsp: return "usp";
  }
  return "unknown";
}

namespace {

void check_shape_args(const ParallelAttentionShape& s, int ulysses) {
  if (s.batch < 1) fail_argument("shape.batch", ">= 1", s.batch);
  if (s.seq < 1) fail_argument("shape.seq", ">= 1", s.seq);
  if (s.head_dim < 1) fail_argument("shape.head_dim", ">= 1", s.head_dim);
  if (s.kv_heads < 1 || s.heads % s.kv_heads != 0)
    fail_argument("shape.kv_heads", detail::concat("a divisor of the ", s.heads, " query heads"), s.kv_heads);
  if (s.heads % ulysses != 0)
    fail_argument("shape.heads", detail::concat("a multiple of the Ulysses degree ", ulysses), s.heads);
  if (s.kv_heads % ulysses != 0)
    fail_argument("shape.kv_heads", detail::concat("a multiple of the Ulysses degree ", ulysses), s.kv_heads);
  if (s.mask_block_q < 0 || s.mask_block_kv < 0 || (s.mask_block_q == 0) != (s.mask_block_kv == 0))
    fail_argument("shape.mask_block_q/mask_block_kv", "both 0 (dense only) or both >= 1",
                  detail::concat(s.mask_block_q, "/", s.mask_block_kv));
}

void check_group(const Communicator* comm, int degree, const Device& device, const std::string& name) {
  if (comm == nullptr) fail_argument("groups." + name, "a communicator", "null");
  if (comm->size() != degree)
    fail_argument("groups." + name, detail::concat(degree, " ranks (the configured degree)"), comm->size());
  if (!(comm->device() == device))
    fail_argument("groups." + name, detail::concat("a communicator of ", device.str(), " tensors (shape.device)"),
                  comm->device().str());
}

ParallelStrategy strategy_for(int ulysses, int ring) {
  if (ulysses > 1 && ring > 1) return ParallelStrategy::kUsp;
  if (ulysses > 1) return ParallelStrategy::kUlysses;
  if (ring > 1) return ParallelStrategy::kRing;
  return ParallelStrategy::kLocal;
}

// Real tokens of ring position `position` (chunks of `chunk` tokens over `length`).
int64_t chunk_valid(int64_t length, int64_t chunk, int64_t position) {
  return std::clamp<int64_t>(length - position * chunk, 0, chunk);
}

void check_bshd_arg(const TensorView& t, const Shape& shape, DType dtype, Device device, const std::string& name) {
  check_shape(t, shape, name);
  check_dtype(t, dtype, name);
  check_device(t, device, name);
  if (t.data() == nullptr && t.numel() > 0) fail_argument(name, "a tensor with data", "a null data pointer");
}

// (U, B, L, H/U, D) views of a shard (B, L, H, D) and of its gathered form (B, U*L, H/U, D) in the
// order of the all-to-all's staging buffers: index u is head group u of the shard and sequence
// shard u of the gathered tensor. Each side of the exchange is then one strided copy (one kernel on
// CUDA) between such a view and a contiguous staging buffer.
TensorView shard_by_head_group(const TensorView& shard, int64_t groups) {
  const int64_t heads = shard.size(2) / groups;
  return TensorView(shard.data(), shard.dtype(), shard.device(), {groups, shard.size(0), shard.size(1), heads, shard.size(3)},
                    {heads * shard.stride(2), shard.stride(0), shard.stride(1), shard.stride(2), shard.stride(3)});
}
TensorView gathered_by_shard(const TensorView& gathered, int64_t groups) {
  const int64_t length = gathered.size(1) / groups;
  return TensorView(gathered.data(), gathered.dtype(), gathered.device(),
                    {groups, gathered.size(0), length, gathered.size(2), gathered.size(3)},
                    {length * gathered.stride(1), gathered.stride(0), gathered.stride(1), gathered.stride(2), gathered.stride(3)});
}

// The view of `shape` and `strides` that starts `offset` elements into `buffer`.
TensorView view_at(const TensorView& buffer, int64_t offset, const Shape& shape, const Shape& strides) {
  auto* data = static_cast<char*>(buffer.data()) + offset * static_cast<int64_t>(dtype_size(buffer.dtype()));
  return TensorView(data, buffer.dtype(), buffer.device(), shape, strides);
}

// A shard (B, L, H, D) as (G, U, B, L, H/(U*G), D): index (g, u) is head group g of the heads that
// Ulysses rank u attends to (heads u*H/U + g*H/(U*G) ...).
TensorView shard_by_head_group_and_rank(const TensorView& shard, int64_t head_groups, int64_t ranks) {
  const int64_t per_rank = shard.size(2) / ranks, heads = per_rank / head_groups;
  return TensorView(shard.data(), shard.dtype(), shard.device(),
                    {head_groups, ranks, shard.size(0), shard.size(1), heads, shard.size(3)},
                    {heads * shard.stride(2), per_rank * shard.stride(2), shard.stride(0), shard.stride(1), shard.stride(2),
                     shard.stride(3)});
}

}  // namespace

// One all-to-all over the Ulysses group: `source` (U, ...) is packed into `send` (piece u goes to
// rank u), and what rank u sent is unpacked from `recv` into target[u].
void ParallelAttention::exchange_pieces(const ExecContext& ctx, const TensorView& send, const TensorView& recv,
                                        const TensorView& source, const TensorView& target) {
  copy_rows(ctx, source, send);
  mark(ctx, "ulysses pack");
  ulysses_.all_to_all(ctx, send, recv);
  mark(ctx, "ulysses all_to_all");
  copy_rows(ctx, recv, target);
  mark(ctx, "ulysses unpack");
}

ParallelAttention::ParallelAttention(const ParallelGroups& groups, const ParallelAttentionShape& shape,
                                     const AttentionOptions& options)
    : ulysses_(*groups.ulysses), ring_(*groups.ring), shape_(shape), options_(options) {
  const int ulysses = groups.config.sp_ulysses_degree, ring = groups.config.sp_ring_degree;
  check_group(groups.ulysses.get(), ulysses, shape.device, "ulysses");
  check_group(groups.ring.get(), ring, shape.device, "ring");
  check_shape_args(shape, ulysses);
  if (ring > 1 && (options.causal || options.window_left >= 0 || options.window_right >= 0))
    fail_argument("options", "no causal mask or window under Ring attention (sp_ring_degree > 1)",
                  detail::concat("causal=", options.causal, " window=(", options.window_left, ", ", options.window_right, ")"));
  strategy_ = strategy_for(ulysses, ring);
  // Under Ring a shard boundary must be a block boundary of both block sizes.
  const int64_t alignment = ring > 1 && shape.mask_block_q > 0 ? std::lcm(shape.mask_block_q, shape.mask_block_kv) : 1;
  sharding_ = SequenceSharding::make(shape.seq, static_cast<int64_t>(ulysses) * ring, alignment);
  chunk_ = sharding_.shard_length * ulysses;
  ulysses_rank_ = ulysses_.rank();
  ring_rank_ = ring_.rank();
  ring_sm_margin_ = groups.config.ring_sm_margin;
  head_groups_ = groups.config.ulysses_head_groups;
  ulysses_sm_margin_ = groups.config.ulysses_sm_margin;

  const int64_t B = shape.batch, D = shape.head_dim, heads = shape.heads / ulysses, kv_heads = shape.kv_heads / ulysses;
  // A group of query heads attends to the kv heads of its own group (GQA), so G divides both.
  if (head_groups_ > 1 && (heads % head_groups_ != 0 || kv_heads % head_groups_ != 0))
    fail_argument("ParallelConfig.ulysses_head_groups",
                  detail::concat("a divisor of the ", heads, " query heads and the ", kv_heads,
                                 " kv heads of each Ulysses rank (a group's query heads need their kv heads)"),
                  head_groups_);
  if (ulysses > 1) {
    q_heads_ = Tensor::empty({B, chunk_, heads, D}, shape.dtype, shape.device);
    out_heads_ = Tensor::empty({B, chunk_, heads, D}, shape.dtype, shape.device);
    k_heads_ = Tensor::empty({B, chunk_, kv_heads, D}, shape.dtype, shape.device);
    v_heads_ = Tensor::empty({B, chunk_, kv_heads, D}, shape.dtype, shape.device);
    // Head groups stage q, k and v of every group at once (their exchanges are in flight together).
    const int64_t staged_heads = head_groups_ > 1 ? shape.heads + 2 * shape.kv_heads : shape.heads;
    send_ = Tensor::empty({B * sharding_.shard_length * staged_heads * D}, shape.dtype, shape.device);
    recv_ = Tensor::empty({B * sharding_.shard_length * staged_heads * D}, shape.dtype, shape.device);
  }
  if (ring > 1) {
    for (Tensor& buffer : kv_ring_) buffer = Tensor::empty({2, B, chunk_, kv_heads, D}, shape.dtype, shape.device);
    partial_out_ = Tensor::empty({B, chunk_, heads, D}, shape.dtype, shape.device);
    if (shape.dtype != DType::kF32) {
      first_out_ = Tensor::empty({B, chunk_, heads, D}, shape.dtype, shape.device);
      running_out_ = Tensor::empty({B, chunk_, heads, D}, DType::kF32, shape.device);
    }
    partial_lse_ = Tensor::empty({B * heads * chunk_}, DType::kF32, shape.device);
    lse_ = Tensor::empty({B * heads * chunk_}, DType::kF32, shape.device);
  }
}

std::shared_ptr<const ParallelMaskPlan> ParallelAttention::plan_mask(const BlockMask& global_mask) const {
  const BlockMaskShape& m = global_mask.shape();
  if (shape_.mask_block_q == 0)
    fail_argument("global_mask", "none (this attention was planned with mask_block_q = 0: dense only)", "a mask");
  if (m.block_q != shape_.mask_block_q || m.block_kv != shape_.mask_block_kv)
    fail_argument("global_mask blocks", detail::concat(shape_.mask_block_q, "x", shape_.mask_block_kv, " (as planned)"),
                  detail::concat(m.block_q, "x", m.block_kv));
  if (m.seq_q != shape_.seq || m.seq_kv != shape_.seq)
    fail_argument("global_mask sequences", detail::concat(shape_.seq, " queries and keys (the global sequence)"),
                  detail::concat(m.seq_q, " queries, ", m.seq_kv, " keys"));
  if (m.mask_batch != 1 && m.mask_batch != shape_.batch)
    fail_argument("global_mask.mask_batch", detail::concat("1 or ", shape_.batch), m.mask_batch);
  const int64_t ulysses = ulysses_.size();
  TokenRange heads{0, 1};
  if (m.mask_heads == shape_.heads) {
    heads = {ulysses_rank_ * (shape_.heads / ulysses), shape_.heads / ulysses};
  } else if (m.mask_heads == shape_.kv_heads) {
    heads = {ulysses_rank_ * (shape_.kv_heads / ulysses), shape_.kv_heads / ulysses};
  } else if (m.mask_heads != 1) {
    fail_argument("global_mask.mask_heads", detail::concat("1, ", shape_.kv_heads, " (kv heads) or ", shape_.heads, " (heads)"),
                  m.mask_heads);
  }
  auto plan = std::make_shared<ParallelMaskPlan>();
  const int ring = ring_.size();
  const int64_t queries = chunk_valid(shape_.seq, chunk_, ring_rank_);
  // The slice of `head_range` for the step whose K/V shard is `source`'s.
  const auto cut = [&](ParallelMaskPlan::Step& slot, TokenRange head_range, int source, int64_t keys) {
    slot.mask = slice_block_mask(global_mask, head_range, {ring_rank_ * chunk_, queries}, {source * chunk_, keys});
    slot.has_blocks = slot.mask.nnz() > 0;
    if (shape_.device.is_cuda()) {
      slot.copy = slot.mask.to_device(shape_.device);
      slot.view = slot.copy.view();
    } else {
      slot.view = slot.mask.view();
    }
  };
  plan->steps_.resize(static_cast<size_t>(ring));
  for (int step = 0; step < ring; ++step) {
    const int source = (ring_rank_ - step + ring) % ring;  // the K/V shard held at this step
    const int64_t keys = chunk_valid(shape_.seq, chunk_, source);
    if (queries == 0 || keys == 0) continue;
    cut(plan->steps_[static_cast<size_t>(step)], heads, source, keys);
  }
  if (head_groups_ > 1) {  // Ulysses alone: one step, every key; each group its share of the mask heads
    plan->head_group_steps_.resize(static_cast<size_t>(head_groups_));
    const int64_t group_heads = heads.count / head_groups_;
    for (int group = 0; group < head_groups_; ++group) {
      const TokenRange range = m.mask_heads == 1 ? heads : TokenRange{heads.begin + group * group_heads, group_heads};
      std::vector<ParallelMaskPlan::Step>& steps = plan->head_group_steps_[static_cast<size_t>(group)];
      steps.resize(1);
      if (queries > 0) cut(steps[0], range, 0, queries);
    }
  }
  return plan;
}

void ParallelAttention::check_forward_args(const TensorView& q, const TensorView& k, const TensorView& v,
                                           const TensorView& out) const {
  const int64_t B = shape_.batch, L = sharding_.shard_length, D = shape_.head_dim;
  check_bshd_arg(q, {B, L, shape_.heads, D}, shape_.dtype, shape_.device, "q");
  check_bshd_arg(k, {B, L, shape_.kv_heads, D}, shape_.dtype, shape_.device, "k");
  check_bshd_arg(v, {B, L, shape_.kv_heads, D}, shape_.dtype, shape_.device, "v");
  check_bshd_arg(out, {B, L, shape_.heads, D}, shape_.dtype, shape_.device, "out");
}

void ParallelAttention::forward_with_local_attention(const ExecContext& ctx, const TensorView& q, const TensorView& k,
                                                     const TensorView& v, const TensorView& out, const LocalAttentionFn& attend) {
  if (strategy_ != ParallelStrategy::kUlysses)
    fail_argument("strategy", "ulysses (every token of a head on one rank)", parallel_strategy_name(strategy_));
  check_forward_args(q, k, v, out);
  ulysses_to_heads(ctx, q, q_heads_);
  ulysses_to_heads(ctx, k, k_heads_);
  ulysses_to_heads(ctx, v, v_heads_);
  const int64_t seq = shape_.seq;
  zero_rows(ctx, narrow(out_heads_, 1, seq, chunk_ - seq));  // padding rows come out as zeros
  attend(narrow(q_heads_, 1, 0, seq), narrow(k_heads_, 1, 0, seq), narrow(v_heads_, 1, 0, seq), narrow(out_heads_, 1, 0, seq));
  mark(ctx, "attention");
  ulysses_to_sequence(ctx, out_heads_, out);
}

void ParallelAttention::forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const ParallelMaskPlan* mask) {
  check_forward_args(q, k, v, out);
  if (mask != nullptr && mask->steps().size() != static_cast<size_t>(ring_.size()))
    fail_argument("mask", detail::concat("a plan of ", ring_.size(), " ring steps (from this attention's plan_mask)"),
                  mask->steps().size());
  if (mask != nullptr && mask->head_group_steps_.size() != static_cast<size_t>(head_groups_ > 1 ? head_groups_ : 0))
    fail_argument("mask", detail::concat("a plan for ", head_groups_, " Ulysses head groups (from this attention's plan_mask)"),
                  mask->head_group_steps_.size());
  const std::vector<ParallelMaskPlan::Step>* steps = mask != nullptr ? &mask->steps() : nullptr;
  if (ulysses_.size() == 1) return ring_attention(ctx, q, k, v, out, steps);
  if (head_groups_ > 1) return ulysses_head_group_pipeline(ctx, q, k, v, out, mask);
  ulysses_to_heads(ctx, q, q_heads_);
  ulysses_to_heads(ctx, k, k_heads_);
  ulysses_to_heads(ctx, v, v_heads_);
  ring_attention(ctx, q_heads_, k_heads_, v_heads_, out_heads_, steps);
  ulysses_to_sequence(ctx, out_heads_, out);
}

// Ulysses alone, each rank's heads in G groups. Group g's staging slot (in send_ and recv_) holds
// one piece per rank, each piece that group's q, k and v heads one after the other, so that one
// all-to-all per group moves all three; once they are unpacked the slot carries the group's output
// back. Every group's q/k/v exchange is issued before any attention: they run in that order on the
// communicator's stream, group g+1's under group g's attention, and group g's output exchange under
// group g+1's. Each rank issues the same collectives in the same order (2 G all-to-alls).
void ParallelAttention::ulysses_head_group_pipeline(const ExecContext& ctx, const TensorView& q, const TensorView& k,
                                                    const TensorView& v, const TensorView& out, const ParallelMaskPlan* mask) {
  const int64_t G = head_groups_, U = ulysses_.size();
  const int64_t B = shape_.batch, L = sharding_.shard_length, D = shape_.head_dim;
  const int64_t heads = shape_.heads / (U * G), kv_heads = shape_.kv_heads / (U * G);  // of one group
  const int64_t q_piece = B * L * heads * D, kv_piece = B * L * kv_heads * D;
  const int64_t piece = q_piece + 2 * kv_piece, slot = U * piece;
  // (G, U, B, L, h, D): every group's pieces of one tensor, `offset` elements into each piece.
  const auto staged = [&](const Tensor& buffer, int64_t offset, int64_t h) {
    return view_at(buffer, offset, {G, U, B, L, h, D}, {slot, piece, L * h * D, h * D, D, 1});
  };
  const auto whole_slot = [&](const Tensor& buffer, int64_t group) { return view_at(buffer, group * slot, {slot}, {1}); };
  // Group g's heads after the exchange: (B, chunk, h, D), contiguous, the g-th part of the buffer.
  const auto group_of = [&](const Tensor& buffer, int64_t group, int64_t h) {
    return view_at(buffer, group * B * chunk_ * h * D, {B, chunk_, h, D}, {chunk_ * h * D, h * D, D, 1});
  };
  copy_rows(ctx, shard_by_head_group_and_rank(q, G, U), staged(send_, 0, heads));
  copy_rows(ctx, shard_by_head_group_and_rank(k, G, U), staged(send_, q_piece, kv_heads));
  copy_rows(ctx, shard_by_head_group_and_rank(v, G, U), staged(send_, q_piece + kv_piece, kv_heads));
  mark(ctx, "ulysses pack");
  std::vector<std::unique_ptr<PendingExchange>> inputs(static_cast<size_t>(G)), outputs(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g)
    inputs[static_cast<size_t>(g)] = ulysses_.all_to_all_async(ctx, whole_slot(send_, g), whole_slot(recv_, g));
  mark(ctx, "ulysses all_to_all");  // on CUDA only enqueued; on the CPU the exchanges themselves
  for (int64_t g = 0; g < G; ++g) {
    inputs[static_cast<size_t>(g)]->wait(ctx);
    mark(ctx, "ulysses all_to_all");  // what the previous group's attention did not hide
    const TensorView q_g = group_of(q_heads_, g, heads), k_g = group_of(k_heads_, g, kv_heads);
    const TensorView v_g = group_of(v_heads_, g, kv_heads), out_g = group_of(out_heads_, g, heads);
    copy_rows(ctx, select_first(staged(recv_, 0, heads), g), gathered_by_shard(q_g, U));
    copy_rows(ctx, select_first(staged(recv_, q_piece, kv_heads), g), gathered_by_shard(k_g, U));
    copy_rows(ctx, select_first(staged(recv_, q_piece + kv_piece, kv_heads), g), gathered_by_shard(v_g, U));
    mark(ctx, "ulysses unpack");
    // Another group's exchange is in flight beside every group's attention (the next group's input,
    // the previous group's output): the attention leaves it ulysses_sm_margin multiprocessors.
    ring_attention(ctx, q_g, k_g, v_g, out_g, mask != nullptr ? &mask->head_group_steps_[static_cast<size_t>(g)] : nullptr,
                   ulysses_sm_margin_);
    // The slot is free: the wait above saw its q/k/v exchange end, the unpack above read it.
    const TensorView out_send = view_at(send_, g * slot, {U, B, L, heads, D}, {q_piece, L * heads * D, heads * D, D, 1});
    copy_rows(ctx, gathered_by_shard(out_g, U), out_send);
    mark(ctx, "ulysses pack");
    outputs[static_cast<size_t>(g)] = ulysses_.all_to_all_async(ctx, view_at(send_, g * slot, {U * q_piece}, {1}),
                                           view_at(recv_, g * slot, {U * q_piece}, {1}));
    mark(ctx, "ulysses all_to_all");
  }
  const TensorView out_by_group = shard_by_head_group_and_rank(out, G, U);
  for (int64_t g = 0; g < G; ++g) {
    outputs[static_cast<size_t>(g)]->wait(ctx);
    mark(ctx, "ulysses all_to_all");
    copy_rows(ctx, view_at(recv_, g * slot, {U, B, L, heads, D}, {q_piece, L * heads * D, heads * D, D, 1}),
              select_first(out_by_group, g));
    mark(ctx, "ulysses unpack");
  }
}

void ParallelAttention::forward_with_rows_mask(const ExecContext& ctx, const TensorView& q, const TensorView& k,
                                               const TensorView& v, const TensorView& out, const BlockMaskView& rows) {
  if (strategy_ != ParallelStrategy::kRing)
    fail_argument("strategy", "ring (the query rows split over ranks, every head on each)", parallel_strategy_name(strategy_));
  check_forward_args(q, k, v, out);
  const int ring = ring_.size();
  const int64_t queries = chunk_valid(shape_.seq, chunk_, ring_rank_);
  if (rows.block_q != shape_.mask_block_q || rows.block_kv != shape_.mask_block_kv)
    fail_argument("rows mask blocks", detail::concat(shape_.mask_block_q, "x", shape_.mask_block_kv, " (as planned)"),
                  detail::concat(rows.block_q, "x", rows.block_kv));
  if (rows.seq_q != queries || rows.seq_kv != shape_.seq)
    fail_argument("rows mask sequences", detail::concat(queries, " queries (this rank's) and ", shape_.seq, " keys"),
                  detail::concat(rows.seq_q, " queries, ", rows.seq_kv, " keys"));
  if (rows.mask_batch != 1 && rows.mask_batch != shape_.batch)
    fail_argument("rows mask batch", detail::concat("1 or ", shape_.batch), rows.mask_batch);
  if (rows.mask_heads != 1 && rows.mask_heads != shape_.kv_heads && rows.mask_heads != shape_.heads)
    fail_argument("rows mask heads", detail::concat("1, ", shape_.kv_heads, " or ", shape_.heads), rows.mask_heads);
  if (rows.device != shape_.device) fail_argument("rows mask device", shape_.device.str(), rows.device.str());
  ParallelMaskPlan plan;
  plan.steps_.resize(static_cast<size_t>(ring));
  if (shape_.device.is_cpu()) {
    const int64_t row_count = rows.num_rows();
    const BlockMaskShape whole{rows.mask_batch, rows.mask_heads, rows.seq_q, rows.seq_kv, rows.block_q, rows.block_kv};
    const BlockMask mask = BlockMask::from_csr(whole, std::vector<int32_t>(rows.indptr, rows.indptr + row_count + 1),
                                               std::vector<int32_t>(rows.indices, rows.indices + rows.indptr[row_count]));
    for (int step = 0; step < ring; ++step) {
      const int source = (ring_rank_ - step + ring) % ring;
      const int64_t keys = chunk_valid(shape_.seq, chunk_, source);
      if (queries == 0 || keys == 0) continue;
      ParallelMaskPlan::Step& slot = plan.steps_[static_cast<size_t>(step)];
      slot.mask = slice_block_mask(mask, {0, rows.mask_heads}, {0, queries}, {source * chunk_, keys});
      slot.has_blocks = slot.mask.nnz() > 0;
      slot.view = slot.mask.view();
    }
  } else {
    cut_rows_mask_on_device(ctx, rows, queries, plan);
  }
  ring_attention(ctx, q, k, v, out, &plan.steps_);
}

// The per-step CSRs of `rows` cut by two kernels into ring_mask_slices_ (grown to the largest
// mask seen; the steps' views point into it). Every step with keys may attend: how many blocks a
// slice keeps is known on the device only, and a row without blocks gives lse -inf, which the
// merge ignores.
void ParallelAttention::cut_rows_mask_on_device(const ExecContext& ctx, const BlockMaskView& rows, int64_t queries,
                                                ParallelMaskPlan& plan) {
#ifdef TESSEL_WITH_CUDA
  const int ring = ring_.size();
  const int64_t row_count = rows.num_rows(), chunk_blocks = chunk_ / rows.block_kv;
  const int64_t capacity = row_count * chunk_blocks, needed = ring * (row_count + 1 + capacity);
  if (!ring_mask_slices_.defined() || ring_mask_slices_.numel() < needed)
    ring_mask_slices_ = Tensor::empty({needed}, DType::kI32, shape_.device);
  auto* base = static_cast<int32_t*>(ring_mask_slices_.data());
  parallel_detail::cuda::RingMaskSlices slices;
  slices.indptr = rows.indptr;
  slices.indices = rows.indices;
  slices.rows = row_count;
  slices.kv_blocks = rows.kv_blocks;
  slices.chunk_blocks = chunk_blocks;
  slices.ring = ring;
  slices.rank = ring_rank_;
  slices.out_indptr = base;
  slices.out_indices = base + ring * (row_count + 1);
  slices.capacity = capacity;
  parallel_detail::cuda::slice_ring_mask(ctx.stream, slices);
  mark(ctx, "ring mask slicing");
  for (int step = 0; step < ring; ++step) {
    const int source = (ring_rank_ - step + ring) % ring;
    const int64_t keys = chunk_valid(shape_.seq, chunk_, source);
    if (queries == 0 || keys == 0) continue;
    ParallelMaskPlan::Step& slot = plan.steps_[static_cast<size_t>(step)];
    slot.has_blocks = true;
    slot.view = rows;
    slot.view.indptr = slices.out_indptr + step * (row_count + 1);
    slot.view.indices = slices.out_indices + step * capacity;
    slot.view.seq_kv = keys;
    slot.view.kv_blocks = (keys + rows.block_kv - 1) / rows.block_kv;
  }
#else
  (void)ctx, (void)rows, (void)queries, (void)plan;
  fail_argument("device", "cpu (tessel was built without CUDA)", shape_.device.str());
#endif
}

// The all-to-all send and receive buffers as (U, B, L, H/U, D) for a shard (B, L, H, D) and its
// gathered form (B, U*L, H/U, D).
std::pair<TensorView, TensorView> ParallelAttention::ulysses_staging(const TensorView& shard,
                                                                     const TensorView& gathered) const {
  const Shape staged{ulysses_.size(), shard.size(0), shard.size(1), gathered.size(2), shard.size(3)};
  return {contiguous_prefix(send_, staged), contiguous_prefix(recv_, staged)};
}

// (B, L, H, D) shard -> (B, U*L, H/U, D): chunk u of the send buffer is head group u, chunk u of the
// receive buffer is the sequence shard of Ulysses rank u.
void ParallelAttention::ulysses_to_heads(const ExecContext& ctx, const TensorView& shard, const TensorView& gathered) {
  const auto [send, recv] = ulysses_staging(shard, gathered);
  const int64_t U = ulysses_.size();
  exchange_pieces(ctx, send, recv, shard_by_head_group(shard, U), gathered_by_shard(gathered, U));
}

// The inverse: (B, U*L, H/U, D) -> (B, L, H, D).
void ParallelAttention::ulysses_to_sequence(const ExecContext& ctx, const TensorView& gathered, const TensorView& shard) {
  const auto [send, recv] = ulysses_staging(shard, gathered);
  const int64_t U = ulysses_.size();
  exchange_pieces(ctx, send, recv, gathered_by_shard(gathered, U), shard_by_head_group(shard, U));
}

// q, out (B, chunk, H, D) of this ring position; k, v (B, chunk, H_kv, D). With one ring rank this
// is plain attention over the real tokens. Every step leaves `sm_margin` multiprocessors free (a
// Ulysses head group's exchange beside it), a block-sparse step beside a K/V exchange ring_sm_margin.
void ParallelAttention::ring_attention(const ExecContext& ctx, const TensorView& q, const TensorView& k,
                                       const TensorView& v, const TensorView& out,
                                       const std::vector<ParallelMaskPlan::Step>* mask, int sm_margin) {
  const int ring = ring_.size();
  const int64_t B = q.size(0), H = q.size(2);
  const int64_t queries = chunk_valid(shape_.seq, chunk_, ring_rank_);
  const TensorView q_real = narrow(q, 1, 0, queries), out_real = narrow(out, 1, 0, queries);
  zero_rows(ctx, narrow(out, 1, queries, chunk_ - queries));
  // Which steps attend is known before any of them runs: the empty ones (no query, no key, or a
  // mask slice without blocks) are skipped, and the last one that attends writes `out`.
  std::vector<bool> attends(static_cast<size_t>(ring));
  int attending = 0;
  for (int step = 0; step < ring; ++step) {
    const int64_t keys = chunk_valid(shape_.seq, chunk_, (ring_rank_ - step + ring) % ring);
    const bool has_blocks = mask == nullptr || (*mask)[static_cast<size_t>(step)].has_blocks;
    attends[static_cast<size_t>(step)] = queries > 0 && keys > 0 && has_blocks;
    attending += attends[static_cast<size_t>(step)];
  }
  if (attending == 0) zero_rows(ctx, out_real);  // no key anywhere: rows with no key are 0
  if (ring > 1) {
    copy_rows(ctx, k, select_first(kv_ring_[0], 0));
    copy_rows(ctx, v, select_first(kv_ring_[0], 1));
    mark(ctx, "ring staging");
  }
  // The running result between merges: `out` itself in fp32; an fp32 buffer otherwise, so that
  // fp16/bf16 round once at the end rather than once per ring step. The first step writes
  // first_out (in the attention's dtype), merged into the running result by the second.
  const bool exact = shape_.dtype == DType::kF32 || attending == 1;
  const TensorView running = ring > 1 && !exact ? narrow(running_out_, 1, 0, queries) : out_real;
  const TensorView first_out = ring > 1 && !exact ? narrow(first_out_, 1, 0, queries) : out_real;
  const TensorView lse = ring > 1 ? contiguous_prefix(lse_, {B, H, queries}) : TensorView{};
  const TensorView partial_lse = ring > 1 ? contiguous_prefix(partial_lse_, {B, H, queries}) : TensorView{};
  const TensorView partial_out = ring > 1 ? narrow(partial_out_, 1, 0, queries) : TensorView{};
  int attended = 0;
  for (int step = 0; step < ring; ++step) {
    const int source = (ring_rank_ - step + ring) % ring;
    const int64_t keys = chunk_valid(shape_.seq, chunk_, source);
    // Start passing the K/V shard on before attending to it: the transfer overlaps the attention.
    std::unique_ptr<PendingExchange> pending;
    if (step + 1 < ring) pending = ring_.ring_exchange_async(ctx, kv_ring_[step % 2], kv_ring_[(step + 1) % 2]);
    // A block-sparse step can be as short as the exchange in flight beside it: with a margin it
    // leaves the exchange multiprocessors instead of taking turns with NCCL's kernel. Dense steps
    // are long enough that the exchange, started first, finishes while a few CTAs wait; reserving
    // SMs for the whole step costs more (docs/benchmarks.md, "Ring's exchange beside the attention").
    AttentionOptions step_options = options_;
    step_options.sm_margin = sm_margin;
    if (pending && mask != nullptr) step_options.sm_margin = ring_sm_margin_;
    if (attends[static_cast<size_t>(step)]) {
      const TensorView k_step = ring > 1 ? select_first(kv_ring_[step % 2], 0) : k;
      const TensorView v_step = ring > 1 ? select_first(kv_ring_[step % 2], 1) : v;
      const TensorView k_real = narrow(k_step, 1, 0, keys), v_real = narrow(v_step, 1, 0, keys);
      const TensorView target_out = attended == 0 ? first_out : partial_out;
      const TensorView target_lse = attended == 0 ? lse : partial_lse;
      if (mask != nullptr)
        block_sparse_attention_forward(ctx, q_real, k_real, v_real, (*mask)[static_cast<size_t>(step)].view,
                                       target_out, target_lse, step_options);
      else
        attention_forward(ctx, q_real, k_real, v_real, target_out, target_lse, step_options);
      mark(ctx, "attention");
      if (attended > 0) {
        const TensorView merged_so_far = attended == 1 ? first_out : running;
        const TensorView merged = attended + 1 == attending ? out_real : running;
        merge_attention_states(ctx, merged_so_far, lse, partial_out, partial_lse, merged, lse);
        mark(ctx, "ring merge");
      }
      ++attended;
    }
    if (pending) {
      pending->wait(ctx);
      mark(ctx, "ring exchange wait");  // the exchange time the attention did not hide
    }
  }
}

}  // namespace tessel
