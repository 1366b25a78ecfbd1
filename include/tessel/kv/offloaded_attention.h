// OffloadedAttention: drives chunked prefill and decode of one sequence with its KV offloaded to
// the host — the role of the model's attention layer (docs/architecture.md, KV prefill chunk). Per prefill chunk:
//   begin_chunk (reserve host blocks) → for each layer prefill_layer (store the chunk's KV in the
//   prefill buffer, policy attention, offload hooks, asynchronous offload) → end_chunk (commit).
// Per decoded token:
//   begin_decode_step → for each layer decode_layer (store the token's KV in the decode buffer,
//   policy attention) → end_decode_step (offload the decode buffer once it holds a full block).
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/kv/block_manager.h"
#include "tessel/kv/offload_engine.h"
#include "tessel/kv/sparse_policy.h"

namespace tessel::kv {

class OffloadedAttention {
 public:
  // The policies must outlive this object; they may be the same object. Calls their initialize().
  OffloadedAttention(OffloadEngine& engine, KvBlockManager& manager, SparsePolicy& prefill_policy,
                     SparsePolicy& decode_policy, float softmax_scale = 0.0f);

  // Releases the previous sequence (if any), resets the policies, and starts a new one.
  SequenceId start_sequence();
  SequenceId sequence() const { return seq_; }

  void begin_chunk(int64_t num_tokens, int64_t chunk_idx, int64_t num_chunks);
  // q (1, n, H_q, D), k and v (1, n, H_kv, D) on the engine's device (k, v may be on the host);
  // out (1, n, H_q, D) on the device. Attention runs under ctx (its stream must be the engine's).
  void prefill_layer(const ExecContext& ctx, int64_t layer, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out);
  // Offloads a chunk's KV for one layer without computing attention (restoring a saved prompt
  // cache, or building a long history cheaply in tests). Hooks run as in prefill_layer.
  void store_layer_kv(int64_t layer, const TensorView& k, const TensorView& v);
  void end_chunk();

  void begin_decode_step();
  // q, out (1, 1, H_q, D); k, v (1, 1, H_kv, D). Attention runs under ctx, as prefill_layer.
  void decode_layer(const ExecContext& ctx, int64_t layer, const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out);
  void end_decode_step();

 private:
  void for_each_policy(const auto& f);
  void offload_chunk(int64_t layer);

  OffloadEngine& engine_;
  KvBlockManager& manager_;
  SparsePolicy& prefill_policy_;
  SparsePolicy& decode_policy_;
  float scale_;
  SequenceId seq_ = -1;
  // Current prefill chunk.
  bool in_chunk_ = false;
  std::vector<int32_t> chunk_blocks_;
  int64_t chunk_tokens_ = 0, chunk_idx_ = 0, num_chunks_ = 0;
  // Current decode step.
  bool in_decode_step_ = false;
  int64_t decode_position_ = 0;
  bool decode_buffer_full_ = false;
};

}  // namespace tessel::kv
