#include "tessel/sparse/sub_block_mask.h"

#include <algorithm>
#include <string>

#include "tessel/core/error.h"

namespace tessel {
namespace {

int64_t words_per_row(const BlockMaskShape& s) { return (s.block_kv + 31) / 32; }

}  // namespace

std::vector<uint32_t> pack_sub_block_mask(const BlockMask& mask, const std::vector<uint8_t>& bytes) {
  const BlockMaskShape& s = mask.shape();
  const size_t expected = static_cast<size_t>(mask.nnz() * s.block_q * s.block_kv);
  if (bytes.size() != expected)
    fail_argument("pattern.sub_block_mask", std::to_string(expected) + " entries (nnz x block_q x block_kv)",
                  bytes.size());
  const int64_t words = words_per_row(s);
  std::vector<uint32_t> bits(static_cast<size_t>(mask.nnz() * s.block_q * words), 0u);
  for (int64_t row = 0; row < mask.nnz() * s.block_q; ++row) {
    const uint8_t* in = &bytes[static_cast<size_t>(row * s.block_kv)];
    uint32_t* out = &bits[static_cast<size_t>(row * words)];
    for (int64_t c = 0; c < s.block_kv; ++c)
      if (in[c] != 0) out[c / 32] |= 1u << (c % 32);
  }
  return bits;
}

std::vector<uint32_t> extend_sub_block_bits(const BlockMask& from, const std::vector<uint32_t>& bits,
                                            const BlockMask& to) {
  const BlockMaskShape& s = to.shape();
  if (!(from.shape() == s)) throw Error("extend_sub_block_bits: the two masks have different shapes");
  const size_t block_words = static_cast<size_t>(s.block_q * words_per_row(s));
  if (bits.size() != static_cast<size_t>(from.nnz()) * block_words)
    fail_argument("sub-block bits", std::to_string(from.nnz() * static_cast<int64_t>(block_words)) + " words",
                  bits.size());
  std::vector<uint32_t> out(static_cast<size_t>(to.nnz()) * block_words, ~0u);
  for (int64_t row = 0; row < s.num_rows(); ++row) {
    int32_t n_to = to.indptr()[static_cast<size_t>(row)];
    const int32_t to_end = to.indptr()[static_cast<size_t>(row + 1)];
    for (int32_t n = from.indptr()[static_cast<size_t>(row)]; n < from.indptr()[static_cast<size_t>(row + 1)]; ++n) {
      while (n_to < to_end && to.indices()[static_cast<size_t>(n_to)] < from.indices()[static_cast<size_t>(n)]) ++n_to;
      if (n_to == to_end || to.indices()[static_cast<size_t>(n_to)] != from.indices()[static_cast<size_t>(n)])
        throw Error(detail::concat("extend_sub_block_bits: mask row ", row, " lost kv block ",
                                   from.indices()[static_cast<size_t>(n)]));
      std::copy_n(bits.begin() + static_cast<std::ptrdiff_t>(n * block_words), block_words,
                  out.begin() + static_cast<std::ptrdiff_t>(n_to * block_words));
    }
  }
  return out;
}

}  // namespace tessel
