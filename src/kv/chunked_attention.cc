#include "tessel/kv/chunked_attention.h"

#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"

namespace tessel::kv {

bool ring_buffer_attention(const ExecContext& ctx, const TensorView& q, std::span<const BlockRef> blocks, int64_t layer, float scale,
                           OffloadEngine& engine, const TensorView& out, const TensorView& lse) {
  if (blocks.empty()) return false;
  const int64_t num_blocks = static_cast<int64_t>(blocks.size());
  const int64_t num_slots = engine.config().num_slots;
  for (const BlockRef& b : blocks)
    if (b.num_tokens < 1 || b.num_tokens > engine.config().block_size)
      fail_argument("blocks[].num_tokens", detail::concat("in [1, ", engine.config().block_size, "]"), b.num_tokens);

  AttentionOptions options;
  options.scale = scale;
  options.causal = false;
  const TensorView part_out = engine.scratch(kScratchPartialOut, q.shape(), q.dtype());
  const TensorView part_lse = engine.scratch(kScratchPartialLse, lse.shape(), DType::kF32);

  // Phase 1: fill the ring.
  for (int64_t i = 0; i < std::min(num_slots, num_blocks); ++i)
    engine.load_to_slot_layer(i, layer, blocks[static_cast<size_t>(i)].host_block);

  // Phase 2: consume block i from slot i % slots, refill the slot with block i + slots.
  for (int64_t i = 0; i < num_blocks; ++i) {
    const int64_t slot = i % num_slots;
    engine.wait_slot_layer(slot);
    const auto [k, v] = engine.get_kv_for_slot(slot, blocks[static_cast<size_t>(i)].num_tokens);
    const bool first = i == 0;
    attention_forward(ctx, q, k, v, first ? out : part_out, first ? lse : part_lse, options);
    engine.record_slot_compute_done(slot);
    if (i + num_slots < num_blocks)
      engine.load_to_slot_layer(slot, layer, blocks[static_cast<size_t>(i + num_slots)].host_block);
    if (!first) merge_attention_states(ctx, out, lse, part_out, part_lse, out, lse);
  }
  return true;
}

}  // namespace tessel::kv
