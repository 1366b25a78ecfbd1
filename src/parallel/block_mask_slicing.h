// The piece of a block mask planned for the global sequences that one rank computes: a range of
// mask heads, of query tokens and of key tokens. Ranges start on block boundaries and end on a
// block boundary or at the sequence end, so the piece is itself a block mask of the same block
// sizes whose kv-block ids are shifted to the local key range.
#pragma once

#include <cstdint>

#include "tessel/sparse/block_mask.h"

namespace tessel::parallel_detail {

struct TokenRange {
  int64_t begin = 0, count = 0;
};

// heads: a range of mask heads ({0, 1} for a mask broadcast over heads). Throws Error naming the
// range when it is out of bounds or not block-aligned.
BlockMask slice_block_mask(const BlockMask& mask, TokenRange heads, TokenRange queries, TokenRange keys);

}  // namespace tessel::parallel_detail
