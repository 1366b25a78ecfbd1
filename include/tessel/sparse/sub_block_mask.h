// Sub-block masks: token-level masks inside the kept blocks of a BlockMask. The pattern spec
// carries them as bytes (PatternSpec::sub_block_mask: one byte per (kept block, query row, key),
// nonzero = kept); the kernels read them as bits (kernels/block_mask_view.h: per kept block and
// query row, ceil(block_kv / 32) uint32 words). These functions convert between the two and keep
// the bits aligned with a mask that gains blocks.
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/sparse/block_mask.h"

namespace tessel {

// Packs the spec's bytes ((nnz, block_q, block_kv) in `mask` order) into the kernels' bits.
// Throws Error naming pattern.sub_block_mask when the size is not nnz * block_q * block_kv.
std::vector<uint32_t> pack_sub_block_mask(const BlockMask& mask, const std::vector<uint8_t>& bytes);

// The bits for `to`, a mask holding every block of `from` (same shape): blocks of `from` keep
// their bits, blocks only `to` has are whole (every pair kept), as always-keep blocks are.
// Throws Error when `to` lacks a block of `from` or the shapes differ.
std::vector<uint32_t> extend_sub_block_bits(const BlockMask& from, const std::vector<uint32_t>& bits,
                                            const BlockMask& to);

}  // namespace tessel
