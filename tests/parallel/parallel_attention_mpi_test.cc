// Multi-process tests, launched by ctest through mpirun with 2 and 4 ranks: the MPI communicator's
// operations, and every sequence-parallel strategy the world size allows (Ulysses, Ring, USP, each
// also under CFG-parallel), dense, block-sparse (random and radial masks) and bf16, on an odd
// sequence length with GQA, against
// single-process attention on the same inputs. Every rank computes the single-process result
// itself, so nothing but the parallel path crosses ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attention_test_inputs.h"
#include "block_mask_slicing.h"
#include "multi_process_test_main.h"
#include "error_of.h"
#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"
#include "tessel/parallel/cfg_parallel.h"
#include "tessel/parallel/communicator.h"
#include "tessel/parallel/metered_communicator.h"
#include "tessel/parallel/parallel_attention.h"
#include "tessel/parallel/parallel_config.h"
#include "tessel/parallel/sequence_sharding.h"
#include "tessel/parallel/traced_communicator.h"
#include "tessel/core/log.h"
#include "tessel/core/sync_trace.h"

namespace tessel {
namespace {

Communicator& world() { return testing::test_world(); }

using testing::error_of;

Tensor floats(std::initializer_list<int64_t> shape, float value = 0.0f) {
  Tensor t = Tensor::empty(Shape(shape), DType::kF32);
  fill(t, value);
  return t;
}

TEST(WorldCommunicator, AllToAllAllGatherAllReduceRingAndSplit) {
  const ExecContext ctx;
  const int n = world().size(), me = world().rank();
  EXPECT_EQ(world().engine(), testing::test_world_engine());
  Tensor send = floats({n, 2}), recv = floats({n, 2});
  for (int i = 0; i < n * 2; ++i) send.data_as<float>()[i] = static_cast<float>(me * 100 + i);
  world().all_to_all(ctx, send, recv);
  for (int peer = 0; peer < n; ++peer)  // chunk `peer` of recv is chunk `me` of the peer's send
    for (int j = 0; j < 2; ++j) EXPECT_EQ(recv.data_as<float>()[peer * 2 + j], peer * 100 + me * 2 + j);

  Tensor mine = floats({3}, static_cast<float>(me)), all = floats({n, 3});
  world().all_gather(ctx, mine, all);
  for (int peer = 0; peer < n; ++peer) EXPECT_EQ(all.data_as<float>()[peer * 3 + 2], peer);

  Tensor sum = floats({4}, static_cast<float>(me + 1));
  world().all_reduce_sum(ctx, sum);
  EXPECT_EQ(sum.data_as<float>()[3], n * (n + 1) / 2);

  Tensor token = floats({5}, static_cast<float>(me)), received = floats({5}, -1.0f);
  world().ring_exchange(ctx, token, received);
  EXPECT_EQ(received.data_as<float>()[4], (me + n - 1) % n);
  world().barrier(ctx);

  const auto parity = world().split(me % 2, me);
  EXPECT_EQ(parity->size(), (n - me % 2 + 1) / 2);
  EXPECT_EQ(parity->rank(), me / 2);

  Tensor odd = Tensor::empty({3}, DType::kU8);  // 3 bytes: no equal chunks for 2 or 4 ranks
  EXPECT_NE(error_of([&] { world().all_to_all(ctx, odd, odd); }).find("divisible by the group size"), std::string::npos);
}

// Each rank's edges reach its neighbours in the rank order (not around a ring), in a group whose
// order reverses the world's as well; 100,003 bytes pass the shared-memory slots in pieces. The
// first rank's previous side and the last rank's next side stay untouched.
TEST(WorldCommunicator, NeighbourExchangeSendsEachEdgeToItsNeighbour) {
  const ExecContext ctx;
  const auto reversed = world().split(0, world().size() - 1 - world().rank());
  for (Communicator* group : {&world(), reversed.get()}) {
    const int n = group->size(), me = group->rank();
    const int64_t count = 100003;
    const auto bytes_of = [&](int rank, int side) {
      Tensor t = Tensor::empty({count}, DType::kU8);
      for (int64_t i = 0; i < count; ++i) t.data_as<uint8_t>()[i] = static_cast<uint8_t>(rank * 7 + side * 3 + i * 13);
      return t;
    };
    const Tensor to_previous = bytes_of(me, 0), to_next = bytes_of(me, 1);
    Tensor from_previous = Tensor::empty({count}, DType::kU8), from_next = Tensor::empty({count}, DType::kU8);
    std::fill_n(from_previous.data_as<uint8_t>(), count, uint8_t{0xEE});
    std::fill_n(from_next.data_as<uint8_t>(), count, uint8_t{0xEE});
    group->neighbour_exchange(ctx, to_previous, to_next, from_previous, from_next);
    const Tensor untouched = Tensor::empty({count}, DType::kU8);
    std::fill_n(untouched.data_as<uint8_t>(), count, uint8_t{0xEE});
    const auto same = [&](const Tensor& a, const Tensor& b) { return std::equal(a.data_as<uint8_t>(), a.data_as<uint8_t>() + count, b.data_as<uint8_t>()); };
    EXPECT_TRUE(same(from_previous, me > 0 ? bytes_of(me - 1, 1) : untouched)) << "rank " << me << " of " << n;
    EXPECT_TRUE(same(from_next, me + 1 < n ? bytes_of(me + 1, 0) : untouched)) << "rank " << me << " of " << n;
  }
  Tensor small = Tensor::empty({4}, DType::kU8), other = Tensor::empty({4}, DType::kU8), large = Tensor::empty({5}, DType::kU8);
  const std::string message = error_of([&] { world().neighbour_exchange(ctx, small, large, other, other); });
  EXPECT_NE(message.find("to_next"), std::string::npos) << message;
  Tensor previous = Tensor::empty({4}, DType::kU8);
  const std::string aliased = error_of([&] { world().neighbour_exchange(ctx, small, other, previous, small); });
  EXPECT_NE(aliased.find("from_next"), std::string::npos) << aliased;
}

struct Case : testing::AttentionCase {
  ParallelConfig config;
  // Largest difference allowed from the single-process result: fp32 rounding; for fp16/bf16 the
  // ring's partial outputs are rounded to the dtype before they are merged (in fp32).
  double tolerance() const { return dtype == DType::kF32 ? 2e-6 : 2e-2; }
};

std::string describe(const Case& c) {
  const char* mask = c.block_q == 0 ? "dense" : c.radial ? "radial" : "random mask";
  return detail::concat("ulysses ", c.config.sp_ulysses_degree, " ring ", c.config.sp_ring_degree, " cfg ",
                        c.config.cfg_parallel_size, " ", dtype_name(c.dtype), " S=", c.seq, " ", mask, " mask heads ",
                        c.mask_heads, " mask batch ", c.mask_batch);
}

using Inputs = testing::AttentionInputs;
using testing::max_abs_difference;

// The same tensors on every rank (seeded); `branch` selects the CFG branch's inputs.
Inputs make_inputs(const Case& c, int branch) { return testing::make_attention_inputs(c, 1000 + 10 * static_cast<uint64_t>(branch)); }

Tensor single_process_attention(const Case& c, const Inputs& in) {
  Tensor out = Tensor::empty(in.q.shape(), c.dtype);
  if (c.block_q > 0)
    block_sparse_attention_forward(ExecContext{}, in.q, in.k, in.v, in.mask.view(), out, TensorView{});
  else
    attention_forward(ExecContext{}, in.q, in.k, in.v, out, TensorView{});
  return out;
}

void expect_matches_single_process(const Case& c) {
  SCOPED_TRACE(describe(c));
  const ExecContext ctx;
  const ParallelGroups groups = initialize_parallel_groups(world(), c.config);
  const int branch = cfg_branch(*groups.cfg);
  const Inputs in = make_inputs(c, branch);
  const Tensor expected = single_process_attention(c, in);

  ParallelAttentionShape shape{c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, c.dtype, Device::cpu(), c.block_q, c.block_kv};
  ParallelAttention attention(groups, shape);
  const SequenceSharding& sharding = attention.sharding();
  const int64_t part = groups.coordinates.sequence, L = sharding.shard_length;
  const auto [q, k, v, out] = testing::take_attention_shards(c, sharding, part, in);
  std::shared_ptr<const ParallelMaskPlan> plan;
  if (c.block_q > 0) plan = attention.plan_mask(in.mask);
  attention.forward(ctx, q, k, v, out, plan.get());

  // This rank's shard, padding included (zeros), then the whole output gathered over the group.
  Tensor expected_shard = Tensor::empty(out.shape(), c.dtype);
  take_shard(ctx, sharding, part, expected, expected_shard);
  EXPECT_LE(max_abs_difference(out, expected_shard), c.tolerance()) << "shard " << part;

  if (c.block_q > 0 && attention.strategy() == ParallelStrategy::kRing) {
    // The same mask given as this rank's query rows only, as a rank that estimated them alone has
    // it (forward_with_rows_mask cuts it per ring step itself): the same output.
    const int64_t begin = std::min(part * L, c.seq), queries = std::min(L, c.seq - begin);
    BlockMask rows;
    if (queries > 0) {
      rows = parallel_detail::slice_block_mask(in.mask, {0, c.mask_heads}, {begin, queries}, {0, c.seq});
    } else {
      const BlockMaskShape none{c.mask_batch, c.mask_heads, 0, c.seq, c.block_q, c.block_kv};
      rows = BlockMask::from_csr(none, {0}, {});
    }
    Tensor out_from_rows = Tensor::empty(out.shape(), c.dtype);
    fill(out_from_rows, std::nan(""));
    attention.forward_with_rows_mask(ctx, q, k, v, out_from_rows, rows.view());
    EXPECT_LE(max_abs_difference(out_from_rows, expected_shard), c.tolerance()) << "shard " << part << " from its rows";
  }
  Tensor gathered = Tensor::empty(expected.shape(), c.dtype);
  Tensor staging = Tensor::empty({static_cast<int64_t>(gather_staging_bytes(sharding, out))}, DType::kU8);
  gather_shards(ctx, *groups.sequence, sharding, out, staging, gathered);
  EXPECT_LE(max_abs_difference(gathered, expected), c.tolerance());

  if (c.config.cfg_parallel_size == 2) {  // both branches' outputs reach every rank, in branch order
    Tensor branches = Tensor::empty({2, c.batch, c.seq, c.heads, c.head_dim}, c.dtype);
    gather_cfg_branches(ctx, *groups.cfg, gathered, branches);
    for (int other = 0; other < 2; ++other) {
      const Tensor reference = single_process_attention(c, make_inputs(c, other));
      char* slot_data = static_cast<char*>(branches.data()) + other * static_cast<int64_t>(reference.nbytes());
      const TensorView slot(slot_data, c.dtype, Device::cpu(), reference.shape());
      EXPECT_LE(max_abs_difference(slot, reference), c.tolerance()) << "cfg branch " << other;
    }
  }
}

// The (ulysses, ring, cfg) layouts that fill the world.
std::vector<ParallelConfig> layouts() {
  std::vector<ParallelConfig> all;
  const int n = world().size();
  for (int cfg : {1, 2})
    for (int ulysses = 1; ulysses <= n; ++ulysses)
      for (int ring = 1; ring <= n; ++ring)
        if (ulysses * ring * cfg == n) {
          ParallelConfig c;
          c.sp_ulysses_degree = ulysses;
          c.sp_ring_degree = ring;
          c.cfg_parallel_size = cfg;
          all.push_back(c);
        }
  return all;
}

// A case on `config` over 45 tokens (5 frames of 3x3 for the radial mask), with 8x4 blocks when
// `sparse`.
Case case_of_45_tokens(const ParallelConfig& config, bool sparse) {
  Case c;
  c.config = config;
  c.seq = 45;
  c.block_q = sparse ? 8 : 0;
  c.block_kv = sparse ? 4 : 0;
  return c;
}

TEST(ParallelAttention, DenseEqualsSingleProcessOnEveryLayout) {
  for (const ParallelConfig& config : layouts()) {
    Case c;
    c.config = config;
    expect_matches_single_process(c);
  }
}

TEST(ParallelAttention, BlockSparseEqualsSingleProcessOnEveryLayout) {
  for (const ParallelConfig& config : layouts()) {
    for (const auto& [mask_batch, mask_heads] : {std::pair<int64_t, int64_t>{2, 8}, {1, 4}, {1, 1}}) {
      Case c = case_of_45_tokens(config, /*sparse=*/true);
      c.mask_batch = mask_batch;
      c.mask_heads = mask_heads;
      expect_matches_single_process(c);
    }
  }
}

TEST(ParallelAttention, RadialPatternEqualsSingleProcessOnEveryLayout) {
  for (const ParallelConfig& config : layouts()) {
    Case c = case_of_45_tokens(config, /*sparse=*/true);
    c.radial = true;
    expect_matches_single_process(c);
  }
}

TEST(MeteredCommunicator, CountsWhatThisRankSendsInEveryGroupSplitFromIt) {
  const ExecContext ctx;
  const int n = world().size();
  const auto meter = std::make_shared<CommunicationMeter>();
  const std::unique_ptr<Communicator> metered = make_metered_communicator(world().split(0, world().rank()), meter);
  Tensor send = floats({n, 4}), recv = floats({n, 4});  // 16 n bytes
  metered->all_to_all(ctx, send, recv);
  EXPECT_DOUBLE_EQ(meter->bytes, 16.0 * (n - 1));
  metered->all_gather(ctx, floats({4}), recv);
  EXPECT_DOUBLE_EQ(meter->bytes, 16.0 * (n - 1) * 2);
  // A group split from it (pairs of ranks, or the rank alone) reports into the same meter.
  const std::unique_ptr<Communicator> pair = metered->split(world().rank() / 2, 0);
  pair->ring_exchange(ctx, floats({4}), floats({4}));
  EXPECT_DOUBLE_EQ(meter->bytes, 16.0 * (n - 1) * 2 + (pair->size() > 1 ? 16.0 : 0.0));
  EXPECT_EQ(meter->calls, 3);
  EXPECT_GE(meter->seconds, 0.0);
  // A neighbour exchange sends to one neighbour at the ends of the line, to two inside it.
  meter->reset();
  metered->neighbour_exchange(ctx, floats({4}), floats({4}), floats({4}), floats({4}));
  const int neighbours = (metered->rank() > 0 ? 1 : 0) + (metered->rank() + 1 < n ? 1 : 0);
  EXPECT_DOUBLE_EQ(meter->bytes, 16.0 * neighbours);
  meter->reset();
  EXPECT_EQ(meter->bytes, 0.0);
}

TEST(ParallelAttention, Bf16DenseAndBlockSparseMatchSingleProcess) {
  for (const ParallelConfig& config : layouts()) {
    for (const bool sparse : {false, true}) {
      Case c = case_of_45_tokens(config, sparse);
      c.dtype = DType::kBF16;
      expect_matches_single_process(c);
    }
  }
}

// Uneven work per rank (the Ring + sparse deadlock on two GPUs): a mask whose first query blocks
// see only the first keys, so that under Ring some ranks skip steps that others attend, with batch
// 2 and a padded last shard (its real rows a strided token range of each buffer). Every rank must
// still make the same collectives in the same order (counted through a traced, metered copy of
// the world, the counts then compared across ranks), and the result must equal one process's.
TEST(ParallelAttention, UnevenPerRankWorkKeepsTheCollectivesInStep) {
  const ExecContext ctx;
  for (const ParallelConfig& config : layouts()) {
    if (config.sp_ring_degree == 1) continue;
    Case c = case_of_45_tokens(config, /*sparse=*/true);
    SCOPED_TRACE(describe(c));
    const auto meter = std::make_shared<CommunicationMeter>();
    std::vector<std::string> trace;
    const LogSink previous = set_log_sink([&](LogLevel, std::string_view line) { trace.emplace_back(line); });
    set_sync_trace(true);
    const std::unique_ptr<Communicator> counted =
        make_metered_communicator(make_traced_communicator(world().split(0, world().rank()), "test-world"), meter);
    const ParallelGroups groups = initialize_parallel_groups(*counted, c.config);
    const Inputs in = make_inputs(c, cfg_branch(*groups.cfg));
    const BlockMaskShape shape{1, 1, c.seq, c.seq, c.block_q, c.block_kv};
    std::vector<uint8_t> dense(static_cast<size_t>(shape.q_blocks() * shape.kv_blocks()), 1);
    for (int64_t row = 0; row < shape.q_blocks() / 2; ++row)  // the first half of the queries: first two key blocks only
      for (int64_t col = 2; col < shape.kv_blocks(); ++col) dense[static_cast<size_t>(row * shape.kv_blocks() + col)] = 0;
    const BlockMask mask = BlockMask::from_dense(shape, dense);
    ParallelAttention attention(groups, {c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, c.dtype, Device::cpu(), c.block_q, c.block_kv});
    const SequenceSharding& sharding = attention.sharding();
    const int64_t part = groups.coordinates.sequence;
    const auto [q, k, v, out] = testing::take_attention_shards(c, sharding, part, in);
    meter->reset();
    attention.forward(ctx, q, k, v, out, attention.plan_mask(mask).get());
    const int64_t calls = meter->calls;
    set_sync_trace(false);
    set_log_sink(previous);

    Tensor expected = Tensor::empty(in.q.shape(), c.dtype), expected_shard = Tensor::empty(out.shape(), c.dtype);
    block_sparse_attention_forward(ctx, in.q, in.k, in.v, mask.view(), expected, TensorView{});
    take_shard(ctx, sharding, part, expected, expected_shard);
    EXPECT_LE(max_abs_difference(out, expected_shard), c.tolerance()) << "shard " << part;
    // Every call was traced, start and done (ring exchanges also their wait), with this rank's name.
    EXPECT_GE(static_cast<int64_t>(trace.size()), 2 * calls);
    for (const std::string& line : trace) EXPECT_NE(line.find("sync-trace "), std::string::npos) << line;
    // The same number of collectives on every rank.
    Tensor mine = floats({1}, static_cast<float>(calls)), all = floats({world().size()});
    world().all_gather(ctx, mine, all);
    for (int r = 0; r < world().size(); ++r) EXPECT_EQ(all.data_as<float>()[r], static_cast<float>(calls)) << "rank " << r;
  }
}

TEST(ParallelAttention, SequenceShorterThanTheGroupLeavesEmptyShards) {
  for (const ParallelConfig& config : layouts()) {
    Case c;
    c.config = config;
    c.seq = 3;
    expect_matches_single_process(c);
  }
}

TEST(ParallelAttention, BadDegreesAndHeadsGiveClearErrors) {
  ParallelConfig too_many;
  too_many.sp_ulysses_degree = world().size() + 1;
  EXPECT_NE(error_of([&] { initialize_parallel_groups(world(), too_many); }).find("sp_ulysses_degree"), std::string::npos);

  ParallelConfig ulysses;
  ulysses.sp_ulysses_degree = world().size();
  const ParallelGroups groups = initialize_parallel_groups(world(), ulysses);
  ParallelAttentionShape odd_heads{1, 16, world().size() + 1, 1, 8};
  EXPECT_NE(error_of([&] { ParallelAttention(groups, odd_heads); })
                .find(detail::concat("shape.heads: expected a multiple of the Ulysses degree ", world().size())),
            std::string::npos);
}

}  // namespace
}  // namespace tessel
