// The ring-buffer pipeline (docs/kv-offload.md): attention of a query chunk over offloaded KV blocks,
// loaded through the engine's device slots so that copies overlap compute, combined with
// log-sum-exp merging.
#pragma once

#include <cstdint>
#include <span>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/kv/offload_engine.h"

namespace tessel::kv {

struct BlockRef {
  int32_t host_block = 0;
  int64_t num_tokens = 0;  // valid tokens, [1, block_size]
};

// Engine scratch ids used by the pipeline (policies may use ids >= kFirstPolicyScratch).
inline constexpr int kScratchPartialOut = 0;
inline constexpr int kScratchPartialLse = 1;
inline constexpr int kScratchHistoryLse = 2;
inline constexpr int kScratchCurrentOut = 3;
inline constexpr int kScratchCurrentLse = 4;
inline constexpr int kFirstPolicyScratch = 8;

// Attends q (1, S_q, H_q, D) non-causally to the listed host blocks of `layer`:
//   preload min(slots, blocks) slots; then for each block wait for its slot, attend with LSE,
//   record compute done, start the load of block i + slots into the freed slot, merge into (out, lse).
// out (1, S_q, H_q, D) same dtype as q, lse fp32 (1, H_q, S_q), both on the engine's device.
// Returns false (and leaves out/lse untouched) when `blocks` is empty.
// Attention runs under ctx (on a CUDA engine ctx.stream must be the engine's compute stream).
bool ring_buffer_attention(const ExecContext& ctx, const TensorView& q, std::span<const BlockRef> blocks, int64_t layer, float scale,
                           OffloadEngine& engine, const TensorView& out, const TensorView& lse);

}  // namespace tessel::kv
