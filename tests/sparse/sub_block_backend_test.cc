// Sub-block masks through the block_sparse backend (PatternSpec::sub_block_mask, bytes per token
// pair inside each kept block): the output equals dense attention under the token-level boolean
// mask the spec describes (masked_attention_forward, an independent fp64 path), always-keep
// blocks are added whole, and the packing errors name the field.
#include <gtest/gtest.h>

#include <random>

#include "sparse/pattern_test_util.h"
#include "sparse/sparse_test_util.h"
#include "tessel/core/error.h"
#include "tessel/sparse/builtin_backends.h"
#include "tessel/sparse/sparse_attention.h"
#include "tessel/sparse/sub_block_mask.h"

namespace tessel {
namespace {

using namespace tessel::testing;

std::vector<uint8_t> random_bytes(size_t count, double keep, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution bit(keep);
  std::vector<uint8_t> bytes(count);
  for (uint8_t& b : bytes) b = bit(rng) ? 1 : 0;
  return bytes;
}

// The (1, H_m, S_q, S_kv) token mask the plan executes: the blocks of `executed`, with the pairs
// of `bytes` inside the blocks of `mask` (the spec's) and whole blocks where always-keep added one.
Tensor token_mask(const BlockMask& mask, const std::vector<uint8_t>& bytes, const BlockMask& executed) {
  const BlockMaskShape& s = mask.shape();
  Tensor dense = Tensor::zeros({1, s.mask_heads, s.seq_q, s.seq_kv}, DType::kU8);
  uint8_t* d = dense.data_as<uint8_t>();
  for (int64_t h = 0; h < s.mask_heads; ++h)
    for (int64_t qb = 0; qb < s.q_blocks(); ++qb) {
      const int64_t row = h * s.q_blocks() + qb;
      for (int32_t n = executed.indptr()[static_cast<size_t>(row)]; n < executed.indptr()[static_cast<size_t>(row + 1)];
           ++n) {
        const int32_t kb = executed.indices()[static_cast<size_t>(n)];
        const int32_t* begin = mask.indices().data() + mask.indptr()[static_cast<size_t>(row)];
        const int32_t* end = mask.indices().data() + mask.indptr()[static_cast<size_t>(row + 1)];
        const int32_t* found = std::lower_bound(begin, end, kb);
        const bool planned = found != end && *found == kb;
        const int64_t position = found - mask.indices().data();
        for (int64_t r = 0; r < s.block_q && qb * s.block_q + r < s.seq_q; ++r)
          for (int64_t c = 0; c < s.block_kv && kb * s.block_kv + c < s.seq_kv; ++c) {
            const bool keep = !planned || bytes[static_cast<size_t>((position * s.block_q + r) * s.block_kv + c)] != 0;
            d[(h * s.seq_q + qb * s.block_q + r) * s.seq_kv + kb * s.block_kv + c] = keep ? 1 : 0;
          }
      }
    }
  return dense;
}

void expect_backend_matches_token_mask(PatternSpec spec, const Qkv& t, uint64_t seed) {
  const auto backend = make_block_sparse_backend();
  const AttentionShape shape = AttentionShape::of(t.q, t.k, t.v);
  spec.sub_block_mask = random_bytes(static_cast<size_t>(spec.block_mask->nnz() * spec.block_q * spec.block_kv), 0.4, seed);
  const auto metadata = backend->make_metadata_builder()->plan(ExecContext{}, spec, ModuleType::kDitSelf, shape);
  Tensor out = poisoned(t.q.shape(), t.q.dtype());
  Tensor lse = poisoned({shape.batch, shape.num_qo_heads, shape.seq_q}, DType::kF32);
  backend->make_impl()->forward(ExecContext{}, t.q, t.k, t.v, *metadata, StepInfo{}, out, lse);

  const Tensor dense_mask = token_mask(*spec.block_mask, spec.sub_block_mask, *metadata->mask);
  Tensor want = poisoned(t.q.shape(), t.q.dtype());
  Tensor want_lse = poisoned({shape.batch, shape.num_qo_heads, shape.seq_q}, DType::kF32);
  masked_attention_forward(ExecContext{}, t.q, t.k, t.v, dense_mask, want, want_lse, 0.0f);
  expect_outputs_near(out, want, 2e-5, lse, want_lse, 2e-4);
}

TEST(SubBlockBackend, EqualsDenseAttentionUnderTheTokenMask) {
  uint64_t seed = 60;
  struct Case {
    int64_t seq_q, seq_kv, heads, kv_heads, mask_heads, block_q, block_kv;
  };
  for (const Case& c : {Case{150, 150, 2, 2, 1, 64, 64}, Case{97, 203, 4, 2, 4, 32, 48}, Case{64, 33, 4, 1, 1, 16, 16}}) {
    SCOPED_TRACE(detail::concat("Sq=", c.seq_q, " Skv=", c.seq_kv, " blocks ", c.block_q, "x", c.block_kv));
    const Qkv t = random_qkv(1, c.seq_q, c.seq_kv, c.heads, c.kv_heads, 32, DType::kF32, seed);
    PatternSpec spec;
    spec.type = PatternType::kBlockSparse;
    spec.block_q = c.block_q;
    spec.block_kv = c.block_kv;
    spec.block_mask = std::make_shared<const BlockMask>(
        BlockMask::random({1, c.mask_heads, c.seq_q, c.seq_kv, c.block_q, c.block_kv}, 0.5, seed));
    expect_backend_matches_token_mask(spec, t, seed++);
    spec.keep_diagonal = true;  // adds whole blocks the bytes do not cover
    spec.sink_blocks = 1;
    expect_backend_matches_token_mask(spec, t, seed++);
  }
}

TEST(SubBlockBackend, PackingErrorsNameTheField) {
  const BlockMask mask = BlockMask::full({1, 1, 100, 100, 64, 64});
  expect_error_containing([&] { pack_sub_block_mask(mask, std::vector<uint8_t>(5, 1)); },
                          {"pattern.sub_block_mask", std::to_string(mask.nnz() * 64 * 64) + " entries"});
  const BlockMask fewer = BlockMask::from_rows(mask.shape(), {{0}, {1}});
  const std::vector<uint32_t> bits(static_cast<size_t>(mask.nnz() * 64 * 2), 1u);
  expect_error_containing([&] { extend_sub_block_bits(mask, bits, fewer); }, {"lost kv block"});
}

TEST(SubBlockBackend, PatternsThatComputeWholeBlocksRejectIt) {
  const auto backend = make_block_sparse_backend();
  PatternSpec spec;
  spec.type = PatternType::kSlidingWindow;  // planned by block_sparse, but not from the explicit mask
  spec.window_size = 16;
  spec.block_q = 64;
  spec.block_kv = 64;
  spec.block_mask = std::make_shared<const BlockMask>(BlockMask::full({1, 1, 128, 128, 64, 64}));
  spec.sub_block_mask.assign(static_cast<size_t>(spec.block_mask->nnz() * 64 * 64), 1);
  expect_error_containing(
      [&] { backend->make_metadata_builder()->plan(ExecContext{}, spec, ModuleType::kDitSelf, 1, 1, 16, 128, 128); },
      {"pattern.sub_block_mask", "computes whole blocks"});
}

TEST(SubBlockBackend, PackedBitsFollowTheBytes) {
  const BlockMask mask = BlockMask::from_rows({1, 1, 3, 40, 3, 40}, {{0}});
  std::vector<uint8_t> bytes(3 * 40, 0);
  bytes[0] = 1;             // row 0, key 0
  bytes[40 + 33] = 1;       // row 1, key 33
  bytes[2 * 40 + 39] = 7;   // row 2, key 39 (any nonzero byte keeps)
  const std::vector<uint32_t> bits = pack_sub_block_mask(mask, bytes);
  EXPECT_EQ(bits, (std::vector<uint32_t>{1u, 0u, 0u, 1u << 1, 0u, 1u << 7}));
}

}  // namespace
}  // namespace tessel
