// A non-owning view of a BSR block mask, the form every attention kernel reads.
// The owning type with validation and conversions is tessel::BlockMask (sparse/block_mask.h).
//
// Rows are (mask_batch, mask_heads, q_blocks) flattened row-major:
//   row(b, h, qb) = (b * mask_heads + h) * q_blocks + qb
// indptr has num_rows + 1 entries (one global CSR, offsets into `indices`);
// indices[indptr[r] .. indptr[r+1]) are the kept kv-block ids of row r, sorted, unique.
// mask_batch ∈ {1, B} and mask_heads ∈ {1, H_kv, H_q} broadcast over the attention tensors.
//
// Optional sub-block masks (token-level masks inside the kept blocks; null = kept blocks are
// computed whole): for the kept block at position n of `indices`, query row r of the block
// (0 <= r < block_q) and key c of the block (0 <= c < block_kv), the pair is kept iff
//   bit (c % 32) of sub_block_bits[(n * block_q + r) * sub_block_words() + c / 32]
// is set. One row of a block is ceil(block_kv / 32) uint32 words (two for the default 64-key
// blocks, so a 128x64 block takes 1 KiB). Bits of tokens past the end of a partial last block are
// ignored. The bits live on `device`, as indptr and indices do.
#pragma once

#include <cstdint>

#include "tessel/core/device.h"

namespace tessel {

struct BlockMaskView {
  const int32_t* indptr = nullptr;
  const int32_t* indices = nullptr;
  int64_t mask_batch = 1;
  int64_t mask_heads = 1;
  int64_t q_blocks = 0;
  int64_t kv_blocks = 0;
  int64_t block_q = 128;
  int64_t block_kv = 64;
  int64_t seq_q = 0;   // tokens; the last block may be partial
  int64_t seq_kv = 0;
  Device device{};
  const uint32_t* sub_block_bits = nullptr;

  int64_t sub_block_words() const { return (block_kv + 31) / 32; }

  int64_t num_rows() const { return mask_batch * mask_heads * q_blocks; }

  // The mask head used by query head `q_head` of `num_q_heads` (GQA group = num_q_heads / num_kv_heads).
  int64_t mask_head_for(int64_t q_head, int64_t num_q_heads, int64_t num_kv_heads) const {
    if (mask_heads == 1) return 0;
    if (mask_heads == num_q_heads) return q_head;
    return q_head / (num_q_heads / num_kv_heads);  // mask_heads == num_kv_heads
  }
  int64_t row(int64_t batch, int64_t mask_head, int64_t q_block) const {
    return ((mask_batch == 1 ? 0 : batch) * mask_heads + mask_head) * q_blocks + q_block;
  }
};

}  // namespace tessel
