// Slicing a global block mask down to one rank's heads, query tokens and key tokens.
#include "block_mask_slicing.h"

#include <algorithm>
#include <string>

#include "tessel/core/error.h"

namespace tessel::parallel_detail {
namespace {

// Checks that `range` lies in [0, extent) and is aligned to `block` (its end may be the extent).
void check_range(const std::string& argument, TokenRange range, int64_t extent, int64_t block) {
  if (range.begin < 0 || range.count < 0 || range.begin + range.count > extent)
    fail_argument(argument, detail::concat("a range inside [0, ", extent, ")"),
                  detail::concat("[", range.begin, ", ", range.begin + range.count, ")"));
  const int64_t end = range.begin + range.count;
  if (range.begin % block != 0 || (end % block != 0 && end != extent))
    fail_argument(argument, detail::concat("a range on block boundaries (block ", block, ", sequence end ", extent, ")"),
                  detail::concat("[", range.begin, ", ", end, ")"));
}

}  // namespace

BlockMask slice_block_mask(const BlockMask& mask, TokenRange heads, TokenRange queries, TokenRange keys) {
  const BlockMaskShape& global = mask.shape();
  check_range("heads", heads, global.mask_heads, 1);
  check_range("queries", queries, global.seq_q, global.block_q);
  check_range("keys", keys, global.seq_kv, global.block_kv);
  BlockMaskShape local = global;
  local.mask_heads = heads.count;
  local.seq_q = queries.count;
  local.seq_kv = keys.count;
  const int32_t first_kv = static_cast<int32_t>(keys.begin / global.block_kv);
  const int32_t end_kv = static_cast<int32_t>(first_kv + local.kv_blocks());
  const int64_t first_q = queries.begin / global.block_q;
  std::vector<int32_t> indptr{0}, indices;
  indptr.reserve(static_cast<size_t>(local.num_rows() + 1));
  for (int64_t b = 0; b < local.mask_batch; ++b)
    for (int64_t h = 0; h < local.mask_heads; ++h)
      for (int64_t qb = 0; qb < local.q_blocks(); ++qb) {
        const int64_t row = (b * global.mask_heads + heads.begin + h) * global.q_blocks() + first_q + qb;
        const auto begin = mask.indices().begin() + mask.indptr()[static_cast<size_t>(row)];
        const auto end = mask.indices().begin() + mask.indptr()[static_cast<size_t>(row + 1)];
        for (auto it = std::lower_bound(begin, end, first_kv); it != end && *it < end_kv; ++it)
          indices.push_back(*it - first_kv);
        indptr.push_back(static_cast<int32_t>(indices.size()));
      }
  return BlockMask::from_csr(local, std::move(indptr), std::move(indices));
}

}  // namespace tessel::parallel_detail
