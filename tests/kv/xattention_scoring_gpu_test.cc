// XAttention-BSA scoring on the device (skips without a GPU): block masses and selection against the
// host scorer on the same bf16 data (partial history blocks, a query tail shorter than the stride,
// GQA), planted blocks, and a 128K-token needle through the whole offloaded prefill path.
//
// Why host and device may differ at all: both read the same bf16 keys and queries, and products of
// bf16 values are exact in fp32, but the sums run in a different order (tensor-core tiles against a
// sequential dot product) and the device takes exp2 of log2-domain sums. Masses agree to ~1e-5
// relative; a (head, query block) can still keep a different block when two blocks' masses fall on
// either side of the threshold cut within that error, and such a flip changes the selection only
// when the block's vote sits exactly at the majority line. Hence at most 1 block may differ.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>

#include "kv/kv_test_util.h"
#include "xattention_scoring.h"
#include "tessel/core/device.h"
#include "tessel/core/random.h"
#include "tessel/kv/offloaded_attention.h"
#include "tessel/kv/policies.h"

namespace tessel::kv {
namespace {

using testing::random_bshd;
using testing::xattention_options;
using testing::rows;

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

constexpr int64_t kHeads = 8, kKvHeads = 2, kDim = 128, kStride = 8;

// Random unit vectors (count, kv_heads, dim).
std::vector<float> unit_vectors(int64_t count, uint64_t seed) {
  Tensor t = random_bshd(count, kKvHeads, kDim, seed);
  std::vector<float> u(t.data_as<float>(), t.data_as<float>() + t.numel());
  for (int64_t i = 0; i < count * kKvHeads; ++i) {
    double norm = 0;
    for (int64_t d = 0; d < kDim; ++d) norm += u[i * kDim + d] * u[i * kDim + d];
    for (int64_t d = 0; d < kDim; ++d) u[i * kDim + d] /= static_cast<float>(std::sqrt(norm));
  }
  return u;
}

// Adds strength × direction(token)[head's kv head] to every row of x (1, S, heads, kDim) in fp32.
template <typename Direction>
void add_direction(Tensor& x, float strength, Direction direction) {
  const int64_t heads = x.size(2), group = heads / kKvHeads;
  float* p = x.data_as<float>();
  for (int64_t t = 0; t < x.size(1); ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const float* u = direction(t, h / group);
      if (u == nullptr) continue;
      for (int64_t d = 0; d < kDim; ++d) p[(t * heads + h) * kDim + d] += strength * u[d];
    }
}

OffloadConfig engine_config(int64_t block, int64_t host_blocks, int64_t max_chunk) {
  OffloadConfig c;
  c.block_size = block;
  c.num_kv_heads = kKvHeads;
  c.head_dim = kDim;
  c.num_slots = 4;
  c.max_chunk_tokens = max_chunk;
  c.num_host_blocks = host_blocks;
  c.dtype = DType::kBF16;
  return c;
}

// Offloads the keys (and values) chunk by chunk through the driver, with no attention.
void offload_history(OffloadedAttention& attention, const Tensor& k, const Tensor& v,
                     const std::vector<int64_t>& chunk_sizes) {
  int64_t first = 0, index = 0;
  for (int64_t n : chunk_sizes) {
    attention.begin_chunk(n, index++, static_cast<int64_t>(chunk_sizes.size()) + 1);
    attention.store_layer_kv(0, rows(k.view(), first, n), rows(v.view(), first, n));
    attention.end_chunk();
    first += n;
  }
}

PolicyContext prefill_context(const KvBlockManager& manager, const TensorView& q, int64_t block) {
  PolicyContext ctx;
  ctx.query = q;
  ctx.is_prefill = true;
  ctx.block_size = block;
  ctx.block_tokens = manager.prefilled_block_tokens(0);
  ctx.total_kv_len = manager.get_prefill_len(0) + q.size(1);
  return ctx;
}

XAttentionBsaPolicy scoring_on(XAttentionScoring where, double threshold = 0.9) {
  return XAttentionBsaPolicy(xattention_options(threshold, kStride, 0.5), where);
}

size_t symmetric_difference(std::vector<int32_t> a, std::vector<int32_t> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::vector<int32_t> diff;
  std::set_symmetric_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(diff));
  return diff.size();
}

// 48 history blocks of 256 tokens, each about one of 4 "topics"; 6 of the 8 query blocks ask about
// topic 0, 2 about topic 1, so the vote keeps topic-0 blocks. Blocks 7 and 20 are partial (232 and 5
// valid tokens: block 20 holds no whole stride group), their tails filled with keys pointing at
// topic 0 that must not be scored. Host block ids are a permutation of the positions (the key copy
// gathers them). The 2045-token query chunk has a 5-token tail the scorers ignore and a last query
// block of 31 reshaped rows.
TEST(XAttentionDeviceScoring, MassesAndSelectionMatchTheHostScorer) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kBlock = 256, kBlocks = 48, kQuery = 2045;
  const std::vector<float> topics = unit_vectors(4, 41);
  auto topic = [&](int64_t t, int64_t kv) { return &topics[static_cast<size_t>((t * kKvHeads + kv) * kDim)]; };
  auto block_topic = [](int64_t b) {
    return static_cast<int64_t>(SplitMix64{static_cast<uint64_t>(b) + 7}.next() % 4);
  };
  std::vector<int32_t> block_tokens(kBlocks, static_cast<int32_t>(kBlock)), available(kBlocks);
  block_tokens[7] = 232;
  block_tokens[20] = 5;
  for (int64_t b = 0; b < kBlocks; ++b) available[static_cast<size_t>(b)] = static_cast<int32_t>(b * 7 % kBlocks);

  const OffloadConfig config = engine_config(kBlock, kBlocks, 4096);
  auto engine = make_cuda_offload_engine(ExecContext{}, config);
  for (int64_t b = 0; b < kBlocks; ++b) {
    Tensor k = random_bshd(kBlock, kKvHeads, kDim, 100 + static_cast<uint64_t>(b), 0.5);
    const int64_t valid = block_tokens[static_cast<size_t>(b)];
    add_direction(k, 8.0f, [&](int64_t tok, int64_t kv) { return topic(tok < valid ? block_topic(b) : 0, kv); });
    add_direction(k, 24.0f, [&](int64_t tok, int64_t kv) { return tok < valid ? nullptr : topic(0, kv); });
    const Tensor k16 = k.to(DType::kBF16);
    const int32_t host = available[static_cast<size_t>(b)];
    engine->write_host_block(0, host, k16.view(), k16.view());  // the whole block, tail included
  }
  Tensor q = random_bshd(kQuery, kHeads, kDim, 44, 0.5);
  add_direction(q, 8.0f, [&](int64_t tok, int64_t kv) {
    const int64_t qb = tok / kBlock;
    return topic((qb == 2 || qb == 5) ? 1 : 0, kv);
  });
  const Tensor q_device = q.to(DType::kBF16).to(Device::cuda(0));
  PolicyContext ctx;
  ctx.query = q_device.view();
  ctx.block_size = kBlock;
  ctx.block_tokens = block_tokens;
  ctx.total_kv_len = kBlocks * kBlock + kQuery;
  XAttentionBsaPolicy host_policy(scoring_on(XAttentionScoring::kHost));
  XAttentionBsaPolicy device_policy(scoring_on(XAttentionScoring::kDevice));

  // Masses: the device's against the host's, entry by entry.
  const XAttentionGeometry g = xattention_geometry(config, q_device.view(), kStride, kBlocks);
  ASSERT_EQ(g.q_rows, 255);
  ASSERT_EQ(g.q_blocks, 8);
  SelectionStats host_stats, device_stats;
  engine->reset_stats();
  const std::vector<float> host_mass = score_on_host(*engine, ctx, available, g, host_stats);
  const std::vector<float> device_mass = score_on_device(*engine, ctx, available, g, device_stats);
  ASSERT_EQ(device_mass.size(), host_mass.size());
  EXPECT_EQ(engine->stats().bytes_h2d_keys, kBlocks * kBlock * kKvHeads * kDim * 2);
  EXPECT_GT(device_stats.score_kernel_seconds, 0.0);
  double worst_relative = 0;
  int64_t bad = 0;
  for (int64_t row = 0; row < kHeads * g.q_blocks; ++row) {
    const double rows_in = static_cast<double>(g.rows_in(row % g.q_blocks));
    double sum = 0;
    for (int64_t b = 0; b < kBlocks; ++b) {
      const double h = host_mass[static_cast<size_t>(row * kBlocks + b)];
      const double d = device_mass[static_cast<size_t>(row * kBlocks + b)];
      sum += d;
      if (!(std::abs(d - h) <= 1e-3 * h + 1e-4 * rows_in)) ++bad;
      if (h > 1e-3 * rows_in) worst_relative = std::max(worst_relative, std::abs(d - h) / h);
    }
    EXPECT_NEAR(sum, rows_in, 1e-3 * rows_in) << "row " << row << ": a row's masses sum to its query rows";
    EXPECT_EQ(device_mass[static_cast<size_t>(row * kBlocks + 20)], 0.0f) << "a block without a whole group";
  }
  EXPECT_EQ(bad, 0) << "mass entries outside 1e-3 relative (+1e-4 x rows absolute); worst relative " << worst_relative;
  std::printf("device vs host masses: worst relative difference %.2e\n", worst_relative);

  // Selections through the policies.
  const std::vector<int32_t> from_host = host_policy.select_blocks(available, *engine, ctx);
  const std::vector<int32_t> from_device = device_policy.select_blocks(available, *engine, ctx);
  EXPECT_LE(symmetric_difference(from_host, from_device), 1u);
  EXPECT_EQ(device_policy.selection_stats().device_scored, 1);
  EXPECT_EQ(host_policy.selection_stats().host_scored, 1);
  // The selection is not trivial: topic-0 blocks in, topic-1 blocks (wanted by 2 of 8 query blocks) out.
  int64_t topic0 = 0, topic0_selected = 0, other_selected = 0;
  for (int32_t b = 1; b + 1 < static_cast<int32_t>(available.size()); ++b) {
    const int32_t host = available[static_cast<size_t>(b)];
    const bool in = std::find(from_device.begin(), from_device.end(), host) != from_device.end();
    const bool wanted = block_topic(b) == 0 && ctx.block_tokens[static_cast<size_t>(b)] >= kStride;
    topic0 += wanted;
    topic0_selected += wanted && in;
    other_selected += !wanted && in;
  }
  EXPECT_GE(topic0_selected, topic0 * 3 / 4) << "of " << topic0 << " topic-0 blocks";
  EXPECT_EQ(other_selected, 0);
  std::printf("selection: host %zu blocks, device %zu blocks of %zu (topic-0 blocks: %lld)\n", from_host.size(),
              from_device.size(), available.size(), static_cast<long long>(topic0));
}

TEST(XAttentionDeviceScoring, SelectsPlantedBlocksPlusFirstAndLast) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kBlock = 64, kBlocks = 16;
  const std::vector<float> u = unit_vectors(1, 51);
  const std::vector<int64_t> planted{4, 7, 10};
  Tensor k = random_bshd(kBlocks * kBlock, kKvHeads, kDim, 52, 0.5);
  add_direction(k, 8.0f, [&](int64_t tok, int64_t kv) {
    const bool in = std::find(planted.begin(), planted.end(), tok / kBlock) != planted.end();
    return in ? &u[static_cast<size_t>(kv * kDim)] : nullptr;
  });
  Tensor q = random_bshd(4 * kBlock, kHeads, kDim, 53, 0.3);
  add_direction(q, 8.0f, [&](int64_t, int64_t kv) { return &u[static_cast<size_t>(kv * kDim)]; });
  const OffloadConfig config = engine_config(kBlock, kBlocks + 8, 4 * kBlock);
  auto engine = make_cuda_offload_engine(ExecContext{}, config);
  KvBlockManager manager(config.num_host_blocks, kBlock);
  XAttentionBsaPolicy xattn(scoring_on(XAttentionScoring::kDevice));
  FullPolicy full;
  OffloadedAttention attention(*engine, manager, xattn, full);
  attention.start_sequence();
  offload_history(attention, k.to(DType::kBF16), random_bshd(kBlocks * kBlock, kKvHeads, kDim, 54).to(DType::kBF16),
                  {4 * kBlock, 4 * kBlock, 4 * kBlock, 4 * kBlock});
  const Tensor q_device = q.to(DType::kBF16).to(Device::cuda(0));
  const auto selected = xattn.select_blocks(manager.get_prefilled_blocks(0), *engine,
                                            prefill_context(manager, q_device.view(), kBlock));
  EXPECT_EQ(selected, (std::vector<int32_t>{0, 4, 7, 10, 15}));
  EXPECT_EQ(xattn.selection_stats().device_scored, 1);
}

// 131,072 tokens: 127 history blocks of 1024 and a 1024-token question chunk whose queries all ask
// for a 16-token needle (keys 64·u, values a ±3 marker) at a random position; haystack keys
// N(0, 0.5²). The needle's strided logit (≈ 22.6) dwarfs the ≈ 16K haystack columns, so each
// (head, query block) keeps only the needle's block(s): the prefill must load at most 4 blocks
// (needle blocks, first, last) and still read the marker on every query row.
TEST(XAttentionDeviceScoring, NeedleAt128KThroughTheOffloadedPrefill) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kSeq = 131072, kBlock = 1024, kChunk = 4096, kQuestion = 1024, kNeedle = 16;
  constexpr int64_t kHistory = kSeq - kQuestion;
  const OffloadConfig config = engine_config(kBlock, kSeq / kBlock + 1, kChunk);
  auto engine = make_cuda_offload_engine(ExecContext{}, config);
  KvBlockManager manager(config.num_host_blocks, kBlock);
  XAttentionBsaPolicy xattn(scoring_on(XAttentionScoring::kDevice, 0.95));
  XAttentionBsaPolicy host_xattn(scoring_on(XAttentionScoring::kHost, 0.95));
  FullPolicy full;
  OffloadedAttention attention(*engine, manager, xattn, full);
  for (uint64_t seed = 0; seed < 2; ++seed) {
    SplitMix64 rng{seed + 900};
    const int64_t position = static_cast<int64_t>(rng.below(static_cast<uint64_t>(kHistory - kNeedle)));
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " needle at " << position);
    const std::vector<float> u = unit_vectors(1, seed + 901);
    std::vector<float> marker(static_cast<size_t>(kKvHeads * kDim));
    for (float& m : marker) m = (rng.next() & 1) ? 3.0f : -3.0f;
    Tensor k = random_bshd(kSeq, kKvHeads, kDim, seed + 902, 0.5), v = random_bshd(kSeq, kKvHeads, kDim, seed + 903);
    for (int64_t tok = position; tok < position + kNeedle; ++tok)
      for (int64_t kv = 0; kv < kKvHeads; ++kv)
        for (int64_t d = 0; d < kDim; ++d) {
          k.data_as<float>()[(tok * kKvHeads + kv) * kDim + d] = 64.0f * u[static_cast<size_t>(kv * kDim + d)];
          v.data_as<float>()[(tok * kKvHeads + kv) * kDim + d] = marker[static_cast<size_t>(kv * kDim + d)];
        }
    Tensor q = random_bshd(kQuestion, kHeads, kDim, seed + 904, 0.3);
    add_direction(q, 4.0f, [&](int64_t, int64_t kv) { return &u[static_cast<size_t>(kv * kDim)]; });
    const Tensor k16 = k.to(DType::kBF16), v16 = v.to(DType::kBF16);
    const Tensor q_device = q.to(DType::kBF16).to(Device::cuda(0));

    attention.start_sequence();
    std::vector<int64_t> chunk_sizes(kHistory / kChunk, kChunk);
    if (kHistory % kChunk != 0) chunk_sizes.push_back(kHistory % kChunk);
    offload_history(attention, k16, v16, chunk_sizes);
    const int64_t chunks = static_cast<int64_t>(chunk_sizes.size()) + 1;
    if (seed == 0) {  // the host scorer picks the same blocks here: nothing sits near a threshold
      const auto& available = manager.get_prefilled_blocks(0);
      const PolicyContext ctx = prefill_context(manager, q_device.view(), kBlock);
      EXPECT_EQ(host_xattn.select_blocks(available, *engine, ctx), xattn.select_blocks(available, *engine, ctx));
    }
    Tensor out = Tensor::zeros({1, kQuestion, kHeads, kDim}, DType::kBF16, Device::cuda(0));
    xattn.reset_selection_stats();
    attention.begin_chunk(kQuestion, chunks - 1, chunks);
    attention.prefill_layer(ExecContext{}, 0, q_device.view(), rows(k16.view(), kHistory, kQuestion),
                            rows(v16.view(), kHistory, kQuestion), out.view());
    attention.end_chunk();
    engine->synchronize();
    const SelectionStats s = xattn.selection_stats();
    EXPECT_EQ(s.device_scored, 1);
    EXPECT_EQ(s.available_blocks, kHistory / kBlock);
    EXPECT_LE(s.selected_blocks, 4);
    const Tensor host_out = out.to(Device::cpu()).to(DType::kF32);
    double worst = 0;
    for (int64_t r = 0; r < kQuestion; ++r)
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t d = 0; d < kDim; ++d) {
          const double got = host_out.data_as<float>()[(r * kHeads + h) * kDim + d];
          const double want = marker[static_cast<size_t>((h / (kHeads / kKvHeads)) * kDim + d)];
          worst = std::isfinite(got) ? std::max(worst, std::abs(got - want)) : INFINITY;
        }
    EXPECT_LT(worst, 0.05);
    std::printf("needle 128K seed %llu: %lld of %lld blocks loaded, marker error %.4f, select %.3f s\n",
                static_cast<unsigned long long>(seed), static_cast<long long>(s.selected_blocks),
                static_cast<long long>(s.available_blocks), worst, s.select_seconds);
  }
}

}  // namespace
}  // namespace tessel::kv
