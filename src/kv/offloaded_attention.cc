#include "tessel/kv/offloaded_attention.h"

#include <algorithm>

#include "tessel/core/error.h"

namespace tessel::kv {

OffloadedAttention::OffloadedAttention(OffloadEngine& engine, KvBlockManager& manager, SparsePolicy& prefill_policy,
                                       SparsePolicy& decode_policy, float softmax_scale)
    : engine_(engine), manager_(manager), prefill_policy_(prefill_policy), decode_policy_(decode_policy),
      scale_(softmax_scale) {
  const OffloadConfig& c = engine.config();
  if (manager.block_size() != c.block_size)
    fail_argument("manager.block_size()", c.block_size, manager.block_size());
  if (manager.num_host_blocks() > c.num_host_blocks)
    fail_argument("manager.num_host_blocks()", detail::concat("<= the engine's ", c.num_host_blocks),
                  manager.num_host_blocks());
  if (!prefill_policy.supports_prefill())
    fail_argument("prefill_policy", "a policy that supports prefill", prefill_policy.name());
  if (!decode_policy.supports_decode())
    fail_argument("decode_policy", "a policy that supports decode", decode_policy.name());
  for_each_policy([&](SparsePolicy& p) {
    p.initialize(c.num_layers, c.num_kv_heads, c.head_dim, c.num_host_blocks, c.dtype, engine.device());
  });
}

void OffloadedAttention::for_each_policy(const auto& f) {
  f(prefill_policy_);
  if (&decode_policy_ != &prefill_policy_) f(decode_policy_);
}

SequenceId OffloadedAttention::start_sequence() {
  if (seq_ >= 0) {
    engine_.synchronize();  // the old sequence's blocks may still be in flight
    manager_.release_sequence(seq_);
  }
  for_each_policy([](SparsePolicy& p) { p.reset(); });
  in_chunk_ = in_decode_step_ = false;
  seq_ = manager_.create_sequence();
  return seq_;
}

void OffloadedAttention::begin_chunk(int64_t num_tokens, int64_t chunk_idx, int64_t num_chunks) {
  if (seq_ < 0) fail_argument("sequence", "start_sequence() first", "none");
  if (in_chunk_ || in_decode_step_) fail_argument("begin_chunk", "no open chunk or decode step", "one open");
  if (num_tokens < 1 || num_tokens > engine_.config().max_chunk_tokens)
    fail_argument("num_tokens", detail::concat("in [1, ", engine_.config().max_chunk_tokens, "]"), num_tokens);
  if (chunk_idx < 0 || chunk_idx >= num_chunks)
    fail_argument("chunk_idx", detail::concat("in [0, ", num_chunks, ")"), chunk_idx);
  chunk_blocks_ = manager_.allocate_prefill_chunk(seq_, num_tokens);
  chunk_tokens_ = num_tokens;
  chunk_idx_ = chunk_idx;
  num_chunks_ = num_chunks;
  in_chunk_ = true;
}

void OffloadedAttention::prefill_layer(const ExecContext& ctx, int64_t layer, const TensorView& q, const TensorView& k, const TensorView& v,
                                       const TensorView& out) {
  if (!in_chunk_) fail_argument("prefill_layer", "inside begin_chunk/end_chunk", "no open chunk");
  if (k.dim() == 4 && k.size(1) != chunk_tokens_)
    fail_argument("k.shape[1]", chunk_tokens_, k.size(1));
  engine_.store_prefill_kv(layer, k, v);
  const ChunkedPrefillArgs args{.q = q, .out = out, .layer_id = layer, .softmax_scale = scale_,
                                .current_chunk_idx = chunk_idx_, .num_chunks = num_chunks_, .seq = seq_,
                                .num_tokens = chunk_tokens_};
  prefill_policy_.compute_chunked_prefill(ctx, args, engine_, manager_);
  offload_chunk(layer);
}

void OffloadedAttention::store_layer_kv(int64_t layer, const TensorView& k, const TensorView& v) {
  if (!in_chunk_) fail_argument("store_layer_kv", "inside begin_chunk/end_chunk", "no open chunk");
  if (k.dim() == 4 && k.size(1) != chunk_tokens_) fail_argument("k.shape[1]", chunk_tokens_, k.size(1));
  engine_.store_prefill_kv(layer, k, v);
  offload_chunk(layer);
}

void OffloadedAttention::offload_chunk(int64_t layer) {
  // Hooks see each block's keys on the device before the device→host copy.
  const int64_t block = engine_.config().block_size;
  const auto [k_chunk, v_chunk] = engine_.get_prefill_buffer_slice(layer, chunk_tokens_);
  for (size_t i = 0; i < chunk_blocks_.size(); ++i) {
    const int64_t first = static_cast<int64_t>(i) * block;
    const int64_t rows = std::min(block, chunk_tokens_ - first);
    const int64_t row_elements = engine_.config().num_kv_heads * engine_.config().head_dim;
    const TensorView k_block(static_cast<char*>(k_chunk.data()) + first * row_elements * dtype_size(k_chunk.dtype()),
                             k_chunk.dtype(), k_chunk.device(), {1, rows, k_chunk.size(2), k_chunk.size(3)});
    for_each_policy([&](SparsePolicy& p) { p.on_prefill_offload(chunk_blocks_[i], layer, k_block, rows); });
  }
  engine_.offload_prefill_blocks(layer, chunk_blocks_, chunk_tokens_);
}

void OffloadedAttention::end_chunk() {
  if (!in_chunk_) fail_argument("end_chunk", "an open chunk", "none");
  manager_.commit_prefill_chunk(seq_);
  in_chunk_ = false;
}

void OffloadedAttention::begin_decode_step() {
  if (seq_ < 0) fail_argument("sequence", "start_sequence() first", "none");
  if (in_chunk_ || in_decode_step_) fail_argument("begin_decode_step", "no open chunk or decode step", "one open");
  decode_position_ = manager_.decode_buffer_len(seq_);
  decode_buffer_full_ = manager_.append_decode_token(seq_);
  in_decode_step_ = true;
}

void OffloadedAttention::decode_layer(const ExecContext& ctx, int64_t layer, const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out) {
  if (!in_decode_step_) fail_argument("decode_layer", "inside begin_decode_step/end_decode_step", "no open step");
  engine_.store_decode_kv(layer, decode_position_, k, v);
  const ChunkedDecodeArgs args{.q = q, .out = out, .layer_id = layer, .softmax_scale = scale_, .seq = seq_};
  decode_policy_.compute_chunked_decode(ctx, args, engine_, manager_);
}

void OffloadedAttention::end_decode_step() {
  if (!in_decode_step_) fail_argument("end_decode_step", "an open decode step", "none");
  in_decode_step_ = false;
  if (!decode_buffer_full_) return;
  const int64_t block = engine_.config().block_size;
  const int32_t host_block = manager_.allocate_decode_block(seq_);
  for (int64_t layer = 0; layer < engine_.config().num_layers; ++layer) {
    const TensorView k_buffer = engine_.decode_buffer_slice(layer, 0, block).first;
    for_each_policy([&](SparsePolicy& p) { p.on_decode_offload(host_block, layer, k_buffer, block); });
    engine_.offload_decode_block(layer, host_block, block);
  }
  manager_.commit_decode_block(seq_, host_block);
}

}  // namespace tessel::kv
