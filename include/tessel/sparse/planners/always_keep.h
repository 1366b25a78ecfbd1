// Blocks every pattern (static or dynamic) may be told to keep regardless of its own rule.
#pragma once

#include <cstdint>

#include "tessel/sparse/block_mask.h"
#include "tessel/sparse/planners/token_layout.h"

namespace tessel {

struct AlwaysKeep {
  // The kv blocks overlapping each q block's token range (bottom-right aligned when
  // seq_q != seq_kv: query i sits at key position i + seq_kv - seq_q).
  bool diagonal = false;
  // kv blocks 0 .. sink_blocks-1 in every row (attention sinks).
  int64_t sink_blocks = 0;
  // The last recent_blocks kv blocks in every row (the most recent tokens of a KV cache).
  int64_t recent_blocks = 0;
  // Rows of q blocks overlapping the text tokens are full, and kv blocks overlapping the text
  // tokens are kept in every row (needs a layout with text_tokens > 0; a no-op otherwise).
  bool text = false;

  bool any() const { return diagonal || sink_blocks > 0 || recent_blocks > 0 || text; }
};

// Sets the always-keep blocks in a dense (rows × kv_blocks) map of `shape` (row-major, 1 = kept).
// `layout` may be null when keep.text is false. Throws Error on a negative sink or recent count.
void apply_always_keep(const BlockMaskShape& shape, const AlwaysKeep& keep, const TokenLayout* layout,
                       std::vector<uint8_t>& dense);

// The same on an owning mask (returns a new mask).
BlockMask with_always_keep(const BlockMask& mask, const AlwaysKeep& keep, const TokenLayout* layout);

}  // namespace tessel
