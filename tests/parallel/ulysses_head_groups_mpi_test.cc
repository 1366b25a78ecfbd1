// Ulysses with its heads pipelined in groups (ParallelConfig::ulysses_head_groups), launched with 2
// and 4 ranks (mpirun, and forked over shared memory): every Ulysses-alone layout of the world
// (Ulysses N, and Ulysses N/2 under CFG-parallel) with G = 1, 2 and 4 groups, dense, block-sparse
// (mask heads H, H_kv and 1, mask batch 1 and 2) and radial, fp32 and bf16, batch 2, on odd
// sequence lengths (padded shards), with and without GQA. G > 1 must give the bits of G = 1 (the
// same per-head attention; only the order of the data movement changes), and G = 1 must equal one
// process's attention within fp32 rounding. Where G does not divide a rank's kv heads the
// construction must fail naming the field. The traced test checks that every rank issues the same
// collectives in the same order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "attention_test_inputs.h"
#include "error_of.h"
#include "multi_process_test_main.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"
#include "tessel/core/sync_trace.h"
#include "tessel/kernels/attention.h"
#include "tessel/parallel/cfg_parallel.h"
#include "tessel/parallel/communicator.h"
#include "tessel/parallel/metered_communicator.h"
#include "tessel/parallel/parallel_attention.h"
#include "tessel/parallel/parallel_config.h"
#include "tessel/parallel/sequence_sharding.h"
#include "tessel/parallel/traced_communicator.h"

namespace tessel {
namespace {

Communicator& world() { return testing::test_world(); }

using testing::error_of;

// Twice the heads of the other attention tests, so that 2 and 4 groups divide a rank's heads at
// Ulysses 2 (8 and 4 kv heads per rank) and 2 groups at Ulysses 4.
struct Case : testing::AttentionCase {
  Case() {
    heads = 16;
    kv_heads = 8;
  }
};

std::string describe(const Case& c, const ParallelConfig& config) {
  const char* mask = c.block_q == 0 ? "dense" : c.radial ? "radial" : "random mask";
  return detail::concat("ulysses ", config.sp_ulysses_degree, " cfg ", config.cfg_parallel_size, " head groups ",
                        config.ulysses_head_groups, " ", dtype_name(c.dtype), " B=", c.batch, " S=", c.seq, " H=", c.heads, "/",
                        c.kv_heads, " ", mask, " mask heads ", c.mask_heads, " mask batch ", c.mask_batch);
}

// The Ulysses-alone layouts of the world with `groups` head groups: Ulysses N, and Ulysses N/2
// under CFG-parallel when N/2 > 1.
std::vector<ParallelConfig> ulysses_layouts(int groups) {
  std::vector<ParallelConfig> all;
  const int n = world().size();
  for (int cfg : {1, 2}) {
    if (n % cfg != 0 || n / cfg < 2) continue;
    ParallelConfig c;
    c.sp_ulysses_degree = n / cfg;
    c.cfg_parallel_size = cfg;
    c.ulysses_head_groups = groups;
    all.push_back(c);
  }
  return all;
}

using Inputs = testing::AttentionInputs;
using testing::max_abs_difference;

// The same tensors on every rank of a CFG branch (seeded by the branch).
Inputs make_inputs(const Case& c, int branch) { return testing::make_attention_inputs(c, 2000 + 10 * static_cast<uint64_t>(branch)); }

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// This rank's output shard of `c` on `config` (out poisoned with NaN first).
Tensor parallel_shard(const Case& c, const ParallelGroups& groups, const Inputs& in) {
  const ExecContext ctx;
  ParallelAttention attention(groups, {c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, c.dtype, Device::cpu(), c.block_q, c.block_kv});
  const testing::AttentionShards s = testing::take_attention_shards(c, attention.sharding(), groups.coordinates.sequence, in);
  const std::shared_ptr<const ParallelMaskPlan> plan = c.block_q > 0 ? attention.plan_mask(in.mask) : nullptr;
  attention.forward(ctx, s.q, s.k, s.v, s.out, plan.get());
  return s.out;
}

// One process's attention, cut to this rank's shard (padding rows zero).
Tensor expected_shard(const Case& c, const ParallelGroups& groups, const Inputs& in, const Shape& shard_shape) {
  const ExecContext ctx;
  Tensor whole = Tensor::empty(in.q.shape(), c.dtype);
  if (c.block_q > 0)
    block_sparse_attention_forward(ctx, in.q, in.k, in.v, in.mask.view(), whole, TensorView{});
  else
    attention_forward(ctx, in.q, in.k, in.v, whole, TensorView{});
  const SequenceSharding sharding = SequenceSharding::make(c.seq, groups.config.sequence_parallel_size());
  Tensor shard = Tensor::empty(shard_shape, c.dtype);
  take_shard(ctx, sharding, groups.coordinates.sequence, whole, shard);
  return shard;
}

// Every head-group count of {1, 2, 4} on every Ulysses-alone layout: G = 1 within fp32 rounding of
// one process, G > 1 bit for bit G = 1; a G that does not divide a rank's heads is refused.
void expect_groups_match(const Case& c) {
  const double tolerance = c.dtype == DType::kF32 ? 2e-6 : 2e-2;
  for (const ParallelConfig& one_group : ulysses_layouts(1)) {
    const ParallelGroups reference_groups = initialize_parallel_groups(world(), one_group);
    const Inputs in = make_inputs(c, cfg_branch(*reference_groups.cfg));
    const Tensor reference = parallel_shard(c, reference_groups, in);
    {
      SCOPED_TRACE(describe(c, one_group));
      EXPECT_LE(max_abs_difference(reference, expected_shard(c, reference_groups, in, reference.shape())), tolerance);
    }
    for (const int head_groups : {2, 4}) {
      ParallelConfig config = one_group;
      config.ulysses_head_groups = head_groups;
      SCOPED_TRACE(describe(c, config));
      const ParallelGroups groups = initialize_parallel_groups(world(), config);
      const int64_t rank_heads = c.heads / config.sp_ulysses_degree, rank_kv_heads = c.kv_heads / config.sp_ulysses_degree;
      if (rank_heads % head_groups != 0 || rank_kv_heads % head_groups != 0) {
        const std::string error = error_of([&] { parallel_shard(c, groups, in); });
        EXPECT_NE(error.find(detail::concat("ParallelConfig.ulysses_head_groups: expected a divisor of the ", rank_heads,
                                            " query heads and the ", rank_kv_heads, " kv heads of each Ulysses rank")),
                  std::string::npos)
            << error;
        continue;
      }
      EXPECT_TRUE(same_bits(parallel_shard(c, groups, in), reference)) << "shard " << groups.coordinates.sequence;
    }
  }
}

TEST(UlyssesHeadGroups, DenseEqualsOneGroupBitForBit) {
  for (const int64_t kv_heads : {16, 8}) {  // without and with GQA
    for (const int64_t seq : {37, 40, 3}) {  // padded shards, even shards, fewer tokens than ranks
      Case c;
      c.kv_heads = kv_heads;
      c.seq = seq;
      expect_groups_match(c);
    }
  }
}

TEST(UlyssesHeadGroups, BlockSparseAndRadialEqualOneGroupBitForBit) {
  for (const auto& [mask_batch, mask_heads] : {std::pair<int64_t, int64_t>{2, 16}, {1, 8}, {1, 1}, {2, 8}}) {
    Case c;
    c.seq = 45;
    c.block_q = 8;
    c.block_kv = 4;
    c.mask_batch = mask_batch;
    c.mask_heads = mask_heads;
    expect_groups_match(c);
  }
  Case radial;
  radial.seq = 45;
  radial.block_q = 8;
  radial.block_kv = 4;
  radial.radial = true;
  expect_groups_match(radial);
}

TEST(UlyssesHeadGroups, Bf16EqualsOneGroupBitForBit) {
  Case c;
  c.dtype = DType::kBF16;
  expect_groups_match(c);
  c.seq = 45;
  c.block_q = 8;
  c.block_kv = 4;
  c.mask_heads = 16;
  expect_groups_match(c);
}

// forward_with_local_attention keeps one call for all of a rank's heads whatever the groups (the
// sparse module's estimate covers them at once), and a plan made for other groups is refused.
TEST(UlyssesHeadGroups, LocalAttentionSeesEveryHeadAndPlansMustMatchTheGroups) {
  const ExecContext ctx;
  for (const ParallelConfig& config : ulysses_layouts(2)) {
    Case c;
    c.seq = 45;
    c.block_q = 8;
    c.block_kv = 4;
    SCOPED_TRACE(describe(c, config));
    const ParallelGroups groups = initialize_parallel_groups(world(), config);
    const Inputs in = make_inputs(c, cfg_branch(*groups.cfg));
    ParallelAttention grouped(groups, {c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, c.dtype, Device::cpu(), c.block_q, c.block_kv});
    const auto [q, k, v, out] = testing::take_attention_shards(c, grouped.sharding(), groups.coordinates.sequence, in);
    int64_t seen_heads = 0;
    grouped.forward_with_local_attention(ctx, q, k, v, out, [&](const TensorView& qh, const TensorView& kh, const TensorView& vh, const TensorView& oh) {
      seen_heads = qh.size(2);
      attention_forward(ctx, qh, kh, vh, oh, TensorView{});
    });
    EXPECT_EQ(seen_heads, c.heads / config.sp_ulysses_degree);
    Case dense = c;
    dense.block_q = dense.block_kv = 0;
    EXPECT_LE(max_abs_difference(out, expected_shard(dense, groups, in, out.shape())), 2e-6);

    ParallelConfig one_group = config;
    one_group.ulysses_head_groups = 1;
    const ParallelGroups other_groups = initialize_parallel_groups(world(), one_group);
    const ParallelAttention ungrouped(other_groups, {c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, c.dtype, Device::cpu(), c.block_q, c.block_kv});
    const auto foreign = ungrouped.plan_mask(in.mask);
    // clang 14 (the sanitizer builds' compiler) cannot capture structured bindings in a lambda: the
    // shards are named in the capture instead.
    EXPECT_NE(error_of([&, &q = q, &k = k, &v = v, &out = out] { grouped.forward(ctx, q, k, v, out, foreign.get()); })
                  .find("a plan for 2 Ulysses head groups"),
              std::string::npos);
  }
}

TEST(UlyssesHeadGroups, ConfigurationsWithoutUlyssesAloneAreRefused) {
  const int n = world().size();
  ParallelConfig c;
  c.ulysses_head_groups = 0;
  c.sp_ulysses_degree = n;
  EXPECT_NE(error_of([&] { c.validate(n); }).find("ParallelConfig.ulysses_head_groups: expected in [1, 1024], got 0"),
            std::string::npos);
  c.ulysses_head_groups = 2;
  EXPECT_NO_THROW(c.validate(n));
  c.ulysses_sm_margin = 1025;
  EXPECT_NE(error_of([&] { c.validate(n); }).find("ParallelConfig.ulysses_sm_margin: expected in [0, 1024] (multiprocessors left free), got 1025"),
            std::string::npos);
  c.ulysses_sm_margin = 16;
  EXPECT_NO_THROW(c.validate(n));
  c.ulysses_head_groups = 1;
  EXPECT_NE(error_of([&] { c.validate(n); }).find("ParallelConfig.ulysses_sm_margin: expected 0 without Ulysses head groups"),
            std::string::npos);
  c.ulysses_sm_margin = 0;
  c.ulysses_head_groups = 2;
  c.sp_ulysses_degree = 1;
  c.sp_ring_degree = n;
  EXPECT_NE(error_of([&] { initialize_parallel_groups(world(), c); })
                .find("ParallelConfig.ulysses_head_groups: expected 1 unless Ulysses runs alone"),
            std::string::npos);
  if (n >= 4) {  // USP 2 x N/2
    c.sp_ulysses_degree = 2;
    c.sp_ring_degree = n / 2;
    EXPECT_NE(error_of([&] { c.validate(n); }).find(detail::concat("with ulysses 2 x ring ", n / 2)), std::string::npos);
  }
}

// The trace lines of one rank with what differs between ranks taken out (process id, time, rank,
// the color of its group's split):
// the sequence number, call and byte count of every collective, in order.
std::string normalized(const std::vector<std::string>& trace) {
  static const std::regex prefix(R"(^.*sync-trace \S+ \S+ )"), rank(R"( rank \d+/)"), color(R"(split\(\d+\))");
  std::string all;
  for (const std::string& line : trace)
    all += std::regex_replace(std::regex_replace(std::regex_replace(line, prefix, ""), rank, " rank "), color, "split") + "\n";
  return all;
}

// Every rank issues the same collectives, in the same order and of the same sizes, under every head
// group count (2 G asynchronous all-to-alls per forward with G > 1): the order NCCL needs when the
// all-to-alls of one communicator run on its own stream beside ctx.stream's.
TEST(UlyssesHeadGroups, EveryRankIssuesTheSameCollectivesInOrder) {
  const ExecContext ctx;
  for (const int head_groups : {1, 2, 4}) {
    for (const ParallelConfig& config : ulysses_layouts(head_groups)) {
      Case c;
      c.kv_heads = 16;
      c.seq = 45;
      c.block_q = 8;
      c.block_kv = 4;
      c.mask_heads = 16;
      SCOPED_TRACE(describe(c, config));
      const auto meter = std::make_shared<CommunicationMeter>();
      std::vector<std::string> trace;
      const LogSink previous = set_log_sink([&](LogLevel, std::string_view line) { trace.emplace_back(line); });
      const std::unique_ptr<Communicator> traced =
          make_metered_communicator(make_traced_communicator(world().split(0, world().rank()), "test-world"), meter);
      const ParallelGroups groups = initialize_parallel_groups(*traced, config);
      const Inputs in = make_inputs(c, cfg_branch(*groups.cfg));
      set_sync_trace(true);
      meter->reset();
      const Tensor out = parallel_shard(c, groups, in);
      const int64_t calls = meter->calls;
      set_sync_trace(false);
      set_log_sink(previous);

      EXPECT_EQ(calls, head_groups > 1 ? 2 * head_groups : 4) << "collectives of one forward";
      EXPECT_LE(max_abs_difference(out, expected_shard(c, groups, in, out.shape())), 2e-6);
      const std::string mine = normalized(trace);
      EXPECT_NE(mine.find(head_groups > 1 ? "all_to_all_async" : "all_to_all"), std::string::npos) << mine;
      // Every rank's normalized trace, gathered: all equal.
      Tensor length = Tensor::empty({1}, DType::kI32), lengths = Tensor::empty({world().size()}, DType::kI32);
      length.data_as<int32_t>()[0] = static_cast<int32_t>(mine.size());
      world().all_gather(ctx, length, lengths);
      bool same_length = true;
      for (int r = 0; r < world().size(); ++r) same_length = same_length && lengths.data_as<int32_t>()[r] == length.data_as<int32_t>()[0];
      ASSERT_TRUE(same_length) << "the ranks' traces differ in length; this rank's:\n" << mine;
      Tensor text = Tensor::empty({static_cast<int64_t>(mine.size())}, DType::kU8);
      std::memcpy(text.data(), mine.data(), mine.size());
      Tensor texts = Tensor::empty({world().size() * static_cast<int64_t>(mine.size())}, DType::kU8);
      world().all_gather(ctx, text, texts);
      for (int r = 0; r < world().size(); ++r)
        EXPECT_EQ(std::string(static_cast<const char*>(texts.data()) + r * mine.size(), mine.size()), mine) << "rank " << r;
    }
  }
}

}  // namespace
}  // namespace tessel
