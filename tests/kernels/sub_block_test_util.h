// Test helpers for sub-block masks (token-level masks inside kept blocks, block_mask_view.h):
// random bits over a random block mask, with whole query rows cleared so that some rows end up
// with no key at all, shared by the CPU and the GPU kernel tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "tessel/kernels/block_mask_view.h"
#include "tessel/sparse/block_mask.h"

namespace tessel::testing {

struct SubBlockCase {
  int64_t batch, seq_q, seq_kv, heads, kv_heads, dim;
  int64_t mask_batch, mask_heads, block_q, block_kv;
  double density;      // of kept blocks
  double bit_density;  // of kept pairs inside a kept block
};

// Sub-block bits for every kept block of `mask`: each pair kept with probability bit_density, and
// query rows with (i % 7 == 3) cleared in every block of their mask row, so they see no key.
inline std::vector<uint32_t> random_sub_block_bits(const BlockMask& mask, double bit_density, uint64_t seed) {
  const BlockMaskShape& s = mask.shape();
  const int64_t words = (s.block_kv + 31) / 32;
  std::vector<uint32_t> bits(static_cast<size_t>(mask.nnz() * s.block_q * words), 0u);
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution keep(bit_density);
  const int64_t q_blocks = s.q_blocks();
  for (int64_t row = 0; row < s.num_rows(); ++row) {
    const int64_t qb = row % q_blocks;
    for (int32_t n = mask.indptr()[static_cast<size_t>(row)]; n < mask.indptr()[static_cast<size_t>(row + 1)]; ++n)
      for (int64_t r = 0; r < s.block_q; ++r) {
        if ((qb * s.block_q + r) % 7 == 3) continue;
        uint32_t* w = &bits[static_cast<size_t>((n * s.block_q + r) * words)];
        for (int64_t c = 0; c < s.block_kv; ++c)
          if (keep(rng)) w[c / 32] |= 1u << (c % 32);
      }
  }
  return bits;
}

inline std::vector<SubBlockCase> sub_block_cases_cpu() {
  return {
      {1, 256, 256, 2, 2, 64, 1, 1, 64, 64, 0.6, 0.5},
      {2, 200, 171, 4, 2, 64, 2, 4, 64, 32, 0.5, 0.7},   // per-batch, per-q-head, partial blocks
      {1, 150, 300, 8, 1, 128, 1, 1, 32, 64, 0.4, 0.3},  // GQA 8, shared mask
      {1, 191, 190, 4, 2, 96, 1, 2, 48, 40, 0.5, 0.6},   // per-kv-head mask, odd block_kv
      {1, 131, 261, 4, 2, 80, 1, 4, 128, 100, 0.4, 0.5},  // block_q > tile rows, 4-word rows
      {1, 77, 45, 2, 1, 64, 1, 2, 16, 16, 0.7, 0.2},     // short odd lengths
  };
}

}  // namespace tessel::testing
