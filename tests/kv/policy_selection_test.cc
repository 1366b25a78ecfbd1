// Quest, XAttention-BSA and Top-K select planted important blocks; Quest keeps sink and recent
// blocks; the XAttention vote keeps the first and last blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kv/kv_test_util.h"
#include "xattention_scoring.h"
#include "tessel/core/error.h"
#include "tessel/kv/offloaded_attention.h"
#include "tessel/kv/policies.h"

namespace tessel::kv {
namespace {

using testing::random_bshd;
using testing::xattention_options;
using testing::rows;

constexpr int64_t kBlock = 32, kBlocks = 16, kKvHeads = 2, kHeads = 4, kDim = 16;

// A random unit direction per kv head, shape (kv_heads, dim).
std::vector<float> directions(uint64_t seed) {
  Tensor t = random_bshd(1, kKvHeads, kDim, seed);
  std::vector<float> u(t.data_as<float>(), t.data_as<float>() + kKvHeads * kDim);
  for (int64_t g = 0; g < kKvHeads; ++g) {
    double norm = 0;
    for (int64_t d = 0; d < kDim; ++d) norm += u[g * kDim + d] * u[g * kDim + d];
    for (int64_t d = 0; d < kDim; ++d) u[g * kDim + d] /= static_cast<float>(std::sqrt(norm));
  }
  return u;
}

// Keys: noise, plus `strength` × u in every token of the planted blocks.
Tensor planted_keys(const std::vector<int64_t>& planted, const std::vector<float>& u, float strength, uint64_t seed) {
  Tensor k = random_bshd(kBlocks * kBlock, kKvHeads, kDim, seed, 0.5);
  float* p = k.data_as<float>();
  for (int64_t b : planted)
    for (int64_t t = b * kBlock; t < (b + 1) * kBlock; ++t)
      for (int64_t g = 0; g < kKvHeads; ++g)
        for (int64_t d = 0; d < kDim; ++d) p[(t * kKvHeads + g) * kDim + d] += strength * u[g * kDim + d];
  return k;
}

// Queries (rows, heads): `strength` × u of the head's kv head plus noise.
Tensor aligned_queries(int64_t count, const std::vector<float>& u, float strength, uint64_t seed) {
  Tensor q = random_bshd(count, kHeads, kDim, seed, 0.3);
  float* p = q.data_as<float>();
  for (int64_t r = 0; r < count; ++r)
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t d = 0; d < kDim; ++d) p[(r * kHeads + h) * kDim + d] += strength * u[(h / (kHeads / kKvHeads)) * kDim + d];
  return q;
}

struct Fixture {
  std::unique_ptr<OffloadEngine> engine;
  KvBlockManager manager{kBlocks + 8, kBlock};
  FullPolicy full;
};

// Offloads `keys` as history through the driver, so the policy hooks gather their statistics.
void build_history(Fixture& f, SparsePolicy& policy, const Tensor& keys) {
  OffloadConfig c;
  c.num_host_blocks = kBlocks + 8;
  c.block_size = kBlock;
  c.num_kv_heads = kKvHeads;
  c.head_dim = kDim;
  c.max_chunk_tokens = 4 * kBlock;
  f.engine = make_cpu_offload_engine(c);
  SparsePolicy& prefill = policy.supports_prefill() ? policy : f.full;
  SparsePolicy& decode = policy.supports_decode() ? policy : f.full;
  OffloadedAttention attention(*f.engine, f.manager, prefill, decode);
  attention.start_sequence();
  const Tensor values = random_bshd(kBlocks * kBlock, kKvHeads, kDim, 7);
  for (int64_t chunk = 0; chunk < kBlocks / 4; ++chunk) {
    attention.begin_chunk(4 * kBlock, chunk, kBlocks / 4 + 1);
    attention.store_layer_kv(0, rows(keys.view(), chunk * 4 * kBlock, 4 * kBlock),
                             rows(values.view(), chunk * 4 * kBlock, 4 * kBlock));
    attention.end_chunk();
  }
}

PolicyContext context(Fixture& f, const Tensor& q, bool prefill) {
  PolicyContext ctx;
  ctx.query = q.view();
  ctx.is_prefill = prefill;
  ctx.block_size = kBlock;
  ctx.block_tokens = f.manager.prefilled_block_tokens(0);
  ctx.total_kv_len = f.manager.get_prefill_len(0);
  return ctx;
}

TEST(QuestPolicy, SelectsPlantedBlocksPlusSinkAndRecent) {
  const std::vector<float> u = directions(1);
  const std::vector<int64_t> planted{3, 9, 12};
  QuestOptions options;
  options.top_k = 3;
  QuestPolicy quest(options);
  Fixture f;
  build_history(f, quest, planted_keys(planted, u, 3.0f, 2));
  const Tensor q = aligned_queries(1, u, 4.0f, 3);
  const auto selected = quest.select_blocks(f.manager.get_prefilled_blocks(0), *f.engine, context(f, q, false));
  EXPECT_EQ(selected, (std::vector<int32_t>{0, 3, 9, 12, 15}));
}

TEST(QuestPolicy, GqaGroupUsesItsOwnKvHeadStatistics) {
  // Plant block 5 only in kv head 1; only query heads 2 and 3 (group of kv head 1) point at it.
  std::vector<float> u = directions(4);
  Tensor k = random_bshd(kBlocks * kBlock, kKvHeads, kDim, 5, 0.5);
  for (int64_t t = 5 * kBlock; t < 6 * kBlock; ++t)
    for (int64_t d = 0; d < kDim; ++d) k.data_as<float>()[(t * kKvHeads + 1) * kDim + d] += 3.0f * u[kDim + d];
  Tensor q = random_bshd(1, kHeads, kDim, 6, 0.3);
  for (int64_t h = 2; h < 4; ++h)
    for (int64_t d = 0; d < kDim; ++d) q.data_as<float>()[h * kDim + d] += 4.0f * u[kDim + d];
  QuestOptions options;
  options.top_k = 1;
  options.sink_blocks = 0;
  options.recent_blocks = 0;
  QuestPolicy quest(options);
  Fixture f;
  build_history(f, quest, k);
  const auto selected = quest.select_blocks(f.manager.get_prefilled_blocks(0), *f.engine, context(f, q, false));
  EXPECT_EQ(selected, (std::vector<int32_t>{5}));
}

TEST(QuestPolicy, MissingStatisticsAreAnError) {
  QuestOptions options;
  options.top_k = 1;
  QuestPolicy quest(options);
  quest.initialize(1, kKvHeads, kDim, 8, DType::kF32, Device::cpu());
  Fixture f;
  build_history(f, f.full, random_bshd(kBlocks * kBlock, kKvHeads, kDim, 1));  // hooks of another policy
  const Tensor q = random_bshd(1, kHeads, kDim, 2);
  EXPECT_THROW(quest.select_blocks({0, 1, 2, 3, 4}, *f.engine, context(f, q, false)), Error);
}

TEST(XAttentionBsaPolicy, SelectsPlantedBlocksPlusFirstAndLast) {
  const std::vector<float> u = directions(11);
  const std::vector<int64_t> planted{4, 7, 10};
  XAttentionBsaPolicy xattn(xattention_options(0.9, 4, 0.5));  // τ 0.9, stride 4
  Fixture f;
  build_history(f, xattn, planted_keys(planted, u, 6.0f, 12));
  const Tensor q = aligned_queries(4 * kBlock, u, 6.0f, 13);
  const auto selected = xattn.select_blocks(f.manager.get_prefilled_blocks(0), *f.engine, context(f, q, true));
  EXPECT_EQ(selected, (std::vector<int32_t>{0, 4, 7, 10, 15}));
}

TEST(XAttentionBsaPolicy, MajorityVoteDropsABlockOnlyOneQueryBlockWants) {
  // Queries of the first query block point at block 6, those of the other three at block 9:
  // block 9 wins 3/4 of the votes, block 6 only 1/4.
  const std::vector<float> u = directions(21), w = directions(22);
  Tensor k = planted_keys({9}, u, 6.0f, 23);
  for (int64_t t = 6 * kBlock; t < 7 * kBlock; ++t)
    for (int64_t g = 0; g < kKvHeads; ++g)
      for (int64_t d = 0; d < kDim; ++d) k.data_as<float>()[(t * kKvHeads + g) * kDim + d] += 6.0f * w[g * kDim + d];
  Tensor q = aligned_queries(4 * kBlock, u, 6.0f, 24);
  const Tensor q_first = aligned_queries(kBlock, w, 6.0f, 25);
  std::copy(q_first.data_as<float>(), q_first.data_as<float>() + q_first.numel(), q.data_as<float>());
  XAttentionBsaPolicy xattn(xattention_options(0.9, 4, 0.5));  // τ 0.9, stride 4
  Fixture f;
  build_history(f, xattn, k);
  const auto selected = xattn.select_blocks(f.manager.get_prefilled_blocks(0), *f.engine, context(f, q, true));
  EXPECT_EQ(selected, (std::vector<int32_t>{0, 9, 15}));
}

TEST(XAttentionBsaPolicy, RejectsABlockSizeThatIsNotAMultipleOfTheStride) {
  XAttentionOptions options;
  options.stride = 5;
  XAttentionBsaPolicy xattn(options);
  Fixture f;
  build_history(f, xattn, random_bshd(kBlocks * kBlock, kKvHeads, kDim, 1));
  const Tensor q = random_bshd(kBlock, kHeads, kDim, 2);
  EXPECT_THROW(xattn.select_blocks(f.manager.get_prefilled_blocks(0), *f.engine, context(f, q, true)), Error);
  EXPECT_THROW(XAttentionBsaPolicy(xattention_options(1.5, 8, 0.5)), Error);
}

TEST(XAttentionBsaPolicy, RefusesEstimatorSettingsItCannotHonour) {
  XAttentionOptions per_head = xattention_options(0.9, 4, 0.5);
  per_head.per_head_threshold = {0.9, 0.8};
  EXPECT_THROW(XAttentionBsaPolicy{per_head}, Error);
  XAttentionOptions scaled = xattention_options(0.9, 4, 0.5);
  scaled.scale = 0.25f;
  EXPECT_THROW(XAttentionBsaPolicy{scaled}, Error);
}

TEST(XAttentionBsaPolicy, ScoringOnTheDeviceNeedsADeviceEngine) {
  XAttentionBsaPolicy device_only(xattention_options(0.9, 4, 0.5), XAttentionScoring::kDevice);
  Fixture f;
  build_history(f, device_only, random_bshd(kBlocks * kBlock, kKvHeads, kDim, 1));
  const Tensor q = random_bshd(kBlock, kHeads, kDim, 2);
  try {
    device_only.select_blocks(f.manager.get_prefilled_blocks(0), *f.engine, context(f, q, true));
    ADD_FAILURE() << "device scoring on a CPU engine did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the offload engine is on the CPU"), std::string::npos) << e.what();
  }
  // kAuto on a CPU engine scores on the host.
  XAttentionBsaPolicy automatic(xattention_options(0.9, 4, 0.5));
  automatic.select_blocks(f.manager.get_prefilled_blocks(0), *f.engine, context(f, q, true));
  EXPECT_EQ(automatic.selection_stats().host_scored, 1);
  EXPECT_EQ(automatic.selection_stats().device_scored, 0);
}

// Selection geometry for hand-made masses (stride and dims do not matter to the rule).
XAttentionGeometry mass_grid(int64_t heads, int64_t kv_heads, int64_t q_rows, int64_t rows_per_qblock, int64_t blocks) {
  XAttentionGeometry g;
  g.heads = heads;
  g.kv_heads = kv_heads;
  g.q_rows = q_rows;
  g.rows_per_qblock = rows_per_qblock;
  g.q_blocks = (q_rows + rows_per_qblock - 1) / rows_per_qblock;
  g.blocks = blocks;
  return g;
}

// The selection rule shared by the host and device scorers, on masses chosen so that each
// (head, query block) keeps a known set: per-row threshold (the last query block has 2 rows, so its
// goal is 0.9 x 2), GQA any-within-group, strict majority vote, first and last always kept.
TEST(XAttentionSelection, ThresholdGqaAnyMajorityVoteFirstAndLast) {
  const XAttentionGeometry g = mass_grid(4, 2, 6, 4, 5);  // 2 query blocks of 4 and 2 rows
  const std::vector<float> keep_12 = {0.0f, 2.0f, 1.7f, 0.2f, 0.1f};    // 4 rows: keeps {1, 2}
  const std::vector<float> keep_13 = {0.1f, 2.0f, 0.2f, 1.7f, 0.0f};    // 4 rows: keeps {1, 3}
  const std::vector<float> keep_1 = {0.1f, 3.7f, 0.1f, 0.1f, 0.0f};     // 4 rows: keeps {1}
  const std::vector<float> keep_13_2 = {0.05f, 1.0f, 0.1f, 0.85f, 0.0f};  // 2 rows: keeps {1, 3}
  const std::vector<float> keep_1_2 = {0.05f, 1.9f, 0.05f, 0.0f, 0.0f};   // 2 rows: keeps {1}
  // Rows (h, qb): kv head 0 = heads 0, 1; kv head 1 = heads 2, 3.
  const std::vector<const std::vector<float>*> rows_of = {&keep_12, &keep_13_2, &keep_13, &keep_1_2,
                                                          &keep_12, &keep_13_2, &keep_1, &keep_1_2};
  std::vector<float> mass;
  for (const auto* r : rows_of) mass.insert(mass.end(), r->begin(), r->end());
  // Votes: block 1 4/4, block 2 2/4 (query block 0 of both kv heads: not more than half), block 3
  // 3/4 (kv head 0 both query blocks, kv head 1 query block 1).
  EXPECT_EQ(select_from_block_masses(mass, g, 0.9, 0.5), (std::vector<int64_t>{0, 1, 3, 4}));
  EXPECT_EQ(select_from_block_masses(mass, g, 0.9, 0.25), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  mass.pop_back();
  EXPECT_THROW(select_from_block_masses(mass, g, 0.9, 0.5), Error);
}

TEST(XAttentionSelection, EqualMassesKeepTheLowerIndexFirst) {
  const XAttentionGeometry g = mass_grid(1, 1, 4, 4, 6);
  const std::vector<float> mass = {0.0f, 1.0f, 1.0f, 1.0f, 1.0f, 0.0f};
  EXPECT_EQ(select_from_block_masses(mass, g, 0.5, 0.0), (std::vector<int64_t>{0, 1, 2, 5}));
}

TEST(TopKPolicy, SelectsTheBlocksWhoseMeanKeyMatches) {
  const std::vector<float> u = directions(31);
  TopKPolicy topk(2);
  Fixture f;
  build_history(f, topk, planted_keys({2, 13}, u, 3.0f, 32));
  const Tensor q = aligned_queries(1, u, 4.0f, 33);
  const auto selected = topk.select_blocks(f.manager.get_prefilled_blocks(0), *f.engine, context(f, q, false));
  EXPECT_EQ(selected, (std::vector<int32_t>{2, 13}));
}

}  // namespace
}  // namespace tessel::kv
