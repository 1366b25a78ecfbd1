#include "tessel/sparse/planners/always_keep.h"

#include <algorithm>

#include "tessel/core/error.h"

namespace tessel {

void apply_always_keep(const BlockMaskShape& shape, const AlwaysKeep& keep, const TokenLayout* layout,
                       std::vector<uint8_t>& dense) {
  if (keep.sink_blocks < 0) fail_argument("always_keep.sink_blocks", ">= 0", keep.sink_blocks);
  if (keep.recent_blocks < 0) fail_argument("always_keep.recent_blocks", ">= 0", keep.recent_blocks);
  const int64_t qb_count = shape.q_blocks(), kvb_count = shape.kv_blocks();
  TESSEL_CHECK(static_cast<int64_t>(dense.size()) == shape.num_rows() * kvb_count,
               "apply_always_keep: dense map has ", dense.size(), " entries, shape needs ", shape.num_rows() * kvb_count);
  const bool text = keep.text && layout != nullptr && layout->text_tokens > 0;
  int64_t text_lo = 0, text_hi = -1;
  if (text) {
    TESSEL_CHECK(layout->seq_len() == shape.seq_q && layout->seq_len() == shape.seq_kv,
                 "always_keep.text: layout has ", layout->seq_len(), " tokens, mask has seq_q ", shape.seq_q,
                 " and seq_kv ", shape.seq_kv);
    text_lo = layout->text_offset();
    text_hi = text_lo + layout->text_tokens - 1;
  }
  const int64_t shift = shape.seq_kv - shape.seq_q;
  for (int64_t r = 0; r < shape.num_rows(); ++r) {
    const int64_t qb = r % qb_count;
    uint8_t* row = dense.data() + r * kvb_count;
    const int64_t q_lo = qb * shape.block_q, q_hi = std::min(shape.seq_q, q_lo + shape.block_q) - 1;
    if (keep.diagonal) {
      const int64_t lo = std::clamp<int64_t>(q_lo + shift, 0, shape.seq_kv - 1);
      const int64_t hi = std::clamp<int64_t>(q_hi + shift, 0, shape.seq_kv - 1);
      if (q_hi + shift >= 0 && q_lo + shift < shape.seq_kv)
        for (int64_t kb = lo / shape.block_kv; kb <= hi / shape.block_kv; ++kb) row[kb] = 1;
    }
    for (int64_t kb = 0; kb < std::min(keep.sink_blocks, kvb_count); ++kb) row[kb] = 1;
    for (int64_t kb = std::max<int64_t>(0, kvb_count - keep.recent_blocks); kb < kvb_count; ++kb) row[kb] = 1;
    if (text) {
      if (q_lo <= text_hi && q_hi >= text_lo) std::fill(row, row + kvb_count, uint8_t{1});
      for (int64_t kb = text_lo / shape.block_kv; kb <= text_hi / shape.block_kv; ++kb) row[kb] = 1;
    }
  }
}

BlockMask with_always_keep(const BlockMask& mask, const AlwaysKeep& keep, const TokenLayout* layout) {
  std::vector<uint8_t> dense = mask.to_dense();
  apply_always_keep(mask.shape(), keep, layout, dense);
  return BlockMask::from_dense(mask.shape(), dense);
}

}  // namespace tessel
