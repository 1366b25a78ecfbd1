// One GPU: groups of one rank (the single-rank communicator, and NCCL when built with it) run the
// parallel attention path, dense and block-sparse, and equal the attention kernels called directly;
// the NCCL communicator's operations run on one rank. The multi-GPU layouts are the MPI test's, run
// on several GPUs. Two GPUs (skipped with fewer): Ulysses 2 with its heads pipelined in groups, one
// thread per rank over a TCP-bootstrapped NCCL world.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "tessel/core/current_device.h"
#include "tessel/core/error.h"
#include "tessel/parallel/sequence_sharding.h"

#include "tessel/core/random.h"
#include "tessel/kernels/attention.h"
#include "tessel/parallel/communicator.h"
#include "tessel/parallel/metered_communicator.h"
#include "tessel/parallel/parallel_attention.h"
#include "tessel/parallel/parallel_config.h"
#include "tessel/sparse/estimators/topk_estimator.h"
#include "tessel/sparse/planners/static_patterns.h"

namespace tessel {
namespace {

double max_abs_difference(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  double worst = 0.0;
  for (int64_t i = 0; i < x.numel(); ++i)
    worst = std::max(worst, std::abs(element_as_double(x, i) - element_as_double(y, i)));
  return worst;
}

Tensor random_on(const Device& device, const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  fill_normal(t, seed);
  return t.to(DType::kBF16).to(device);
}

TEST(ParallelAttentionGpu, OneRankGroupsEqualTheKernels) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped";
  const Device gpu = Device::cuda(0);
  const ExecContext ctx{gpu};
  std::unique_ptr<Communicator> bootstrap = make_single_rank_communicator(Device::cpu());
  std::vector<std::unique_ptr<Communicator>> worlds;
  worlds.push_back(make_single_rank_communicator(gpu));
  if (nccl_compiled()) worlds.push_back(make_nccl_communicator(ctx, *bootstrap, gpu));

  const int64_t batch = 1, seq = 300, heads = 4, kv_heads = 2, dim = 64;
  const Tensor q = random_on(gpu, {batch, seq, heads, dim}, 1);
  const Tensor k = random_on(gpu, {batch, seq, kv_heads, dim}, 2);
  const Tensor v = random_on(gpu, {batch, seq, kv_heads, dim}, 3);
  const BlockMask mask = BlockMask::random({1, heads, seq, seq, 128, 64}, 0.4, 4);
  const BlockMask::DeviceCopy device_mask = mask.to_device(gpu);
  Tensor dense = Tensor::empty(q.shape(), DType::kBF16, gpu), sparse = Tensor::empty(q.shape(), DType::kBF16, gpu);
  attention_forward(ctx, q, k, v, dense, TensorView{});
  block_sparse_attention_forward(ctx, q, k, v, device_mask.view(), sparse, TensorView{});

  for (const auto& world : worlds) {
    SCOPED_TRACE(world->engine());
    const ParallelGroups groups = initialize_parallel_groups(*world, ParallelConfig{});
    ParallelAttention attention(groups, {batch, seq, heads, kv_heads, dim, DType::kBF16, gpu, 128, 64});
    ASSERT_EQ(attention.sharding().shard_length, seq);
    Tensor out = Tensor::empty(q.shape(), DType::kBF16, gpu);
    attention.forward(ctx, q, k, v, out);
    EXPECT_EQ(max_abs_difference(out, dense), 0.0);
    const auto plan = attention.plan_mask(mask);
    attention.forward(ctx, q, k, v, out, plan.get());
    EXPECT_EQ(max_abs_difference(out, sparse), 0.0);

    // Every operation on one rank: what is sent is received.
    Tensor received = Tensor::empty(q.shape(), DType::kBF16, gpu);
    world->all_to_all(ctx, q, received);
    EXPECT_EQ(max_abs_difference(received, q), 0.0);
    Tensor gathered = Tensor::empty(k.shape(), DType::kBF16, gpu);
    world->all_gather(ctx, k, gathered);
    EXPECT_EQ(max_abs_difference(gathered, k), 0.0);
    Tensor summed = random_on(gpu, {7}, 5);
    const Tensor before = summed.to(Device::cpu());
    world->all_reduce_sum(ctx, summed);
    EXPECT_EQ(max_abs_difference(summed, before), 0.0);
    world->ring_exchange(ctx, q, received);
    EXPECT_EQ(max_abs_difference(received, q), 0.0);
    world->barrier(ctx);
    EXPECT_EQ(world->split(0, 0)->size(), 1);
  }
}

// Radial and dynamic top-k masks (planned on the host for the global sequence, as the DiT does)
// through a metered one-rank NCCL group, on an odd sequence with GQA: the parallel path equals the
// kernel called with the same mask, and a group of one sends nothing.
TEST(ParallelAttentionGpu, OneRankNcclGroupRunsRadialAndTopkMasks) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped";
  if (!nccl_compiled()) GTEST_SKIP() << "tessel built without NCCL: one-rank NCCL test skipped";
  const Device gpu = Device::cuda(0);
  const ExecContext ctx{gpu};
  std::unique_ptr<Communicator> bootstrap = make_single_rank_communicator(Device::cpu());
  const auto meter = std::make_shared<CommunicationMeter>();
  const std::unique_ptr<Communicator> world = make_metered_communicator(make_nccl_communicator(ctx, *bootstrap, gpu), meter);
  const ParallelGroups groups = initialize_parallel_groups(*world, ParallelConfig{});

  const int64_t batch = 2, heads = 8, kv_heads = 2, dim = 128;
  StaticPlanRequest radial_request;
  radial_request.layout.grid = {7, 9, 11};  // 693 tokens
  const int64_t seq = radial_request.layout.grid.numel();
  const Tensor q = random_on(gpu, {batch, seq, heads, dim}, 11);
  const Tensor k = random_on(gpu, {batch, seq, kv_heads, dim}, 12);
  const Tensor v = random_on(gpu, {batch, seq, kv_heads, dim}, 13);
  TopkEstimatorOptions topk;
  topk.topk_ratio = 0.3;
  topk.similarity_threshold = -2.0;
  topk.rule = TopkRule::kReachTarget;
  const std::vector<std::pair<const char*, BlockMask>> masks = {
      {"radial", plan_static_pattern(StaticPattern{RadialPattern{}}, radial_request).mask},
      {"dynamic_topk", estimate_topk_mask(ExecContext{}, q.to(Device::cpu()), k.to(Device::cpu()), topk).mask}};
  ParallelAttention attention(groups, {batch, seq, heads, kv_heads, dim, DType::kBF16, gpu, 128, 64});
  for (const auto& [name, mask] : masks) {
    SCOPED_TRACE(name);
    EXPECT_LT(mask.density(), 0.9);
    const BlockMask::DeviceCopy device_mask = mask.to_device(gpu);
    Tensor expected = Tensor::empty(q.shape(), DType::kBF16, gpu), out = Tensor::empty(q.shape(), DType::kBF16, gpu);
    block_sparse_attention_forward(ctx, q, k, v, device_mask.view(), expected, TensorView{});
    attention.forward(ctx, q, k, v, out, attention.plan_mask(mask).get());
    EXPECT_EQ(max_abs_difference(out, expected), 0.0);
  }
  EXPECT_EQ(meter->bytes, 0.0);
}

// Ulysses 2 on two GPUs with G = 1, 2 and 4 head groups (16 heads, 8 kv heads: 8 and 4 per rank; G = 2
// also with --ulysses-sm-margin 32),
// bf16, batch 2, an odd sequence (a padded shard), dense, radial and a random block mask of per-head
// rows: G > 1 gives the bits of G = 1 (the same kernels on the same heads; only the all-to-alls move
// to the communicator's stream and overlap the attention), and G = 1 equals one GPU's kernel on the
// whole sequence within bf16 rounding (2e-2, as the MPI test's bf16 cases).
TEST(ParallelAttentionGpu, UlyssesHeadGroupsOnTwoGpusGiveTheBitsOfOneGroup) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped";
  if (!nccl_compiled()) GTEST_SKIP() << "tessel built without NCCL: two-GPU test skipped";
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, " << cuda_device_count() << " visible: two-GPU test skipped";
  const int64_t batch = 2, heads = 16, kv_heads = 8, dim = 128;
  StaticPlanRequest radial_request;
  radial_request.layout.grid = {7, 11, 13};  // 1001 tokens: shards of 501, the second padded
  const int64_t seq = radial_request.layout.grid.numel();
  Tensor q_host = Tensor::empty({batch, seq, heads, dim}, DType::kF32), k_host = Tensor::empty({batch, seq, kv_heads, dim}, DType::kF32);
  Tensor v_host = Tensor::empty(k_host.shape(), DType::kF32);
  fill_normal(q_host, 21);
  fill_normal(k_host, 22);
  fill_normal(v_host, 23);
  const std::vector<std::pair<const char*, BlockMask>> masks = {
      {"dense", BlockMask{}},
      {"radial", plan_static_pattern(StaticPattern{RadialPattern{}}, radial_request).mask},
      {"random per-head rows", BlockMask::random({batch, heads, seq, seq, 128, 64}, 0.3, 24)}};
  TcpRendezvous rendezvous;
  rendezvous.size = 2;
  rendezvous.port = 29700 + static_cast<int>(getpid() % 200);
  auto rank_steps = [&](int rank) {
    const Device gpu = Device::cuda(rank);
    make_current_device(gpu);
    const ExecContext ctx{gpu};
    TcpRendezvous mine = rendezvous;
    mine.rank = rank;
    const std::unique_ptr<Communicator> world = make_nccl_communicator(ctx, mine, gpu);
    const Tensor q = q_host.to(DType::kBF16).to(gpu), k = k_host.to(DType::kBF16).to(gpu), v = v_host.to(DType::kBF16).to(gpu);
    // One kernel call on the whole sequence per mask: what every grouping must reproduce.
    std::vector<Tensor> wholes, one_group(masks.size());
    for (const auto& [name, mask] : masks) {
      Tensor whole = Tensor::empty(q.shape(), DType::kBF16, gpu);
      if (mask.nnz() > 0) {
        const BlockMask::DeviceCopy device_mask = mask.to_device(gpu);
        block_sparse_attention_forward(ctx, q, k, v, device_mask.view(), whole, TensorView{});
      } else {
        attention_forward(ctx, q, k, v, whole, TensorView{});
      }
      wholes.push_back(std::move(whole));
    }
    // (head groups, multiprocessors each group's attention leaves to the exchanges beside it)
    for (const auto& [head_groups, sm_margin] : {std::pair{1, 0}, {2, 0}, {4, 0}, {2, 32}}) {
      ParallelConfig config;
      config.sp_ulysses_degree = 2;
      config.ulysses_head_groups = head_groups;
      config.ulysses_sm_margin = sm_margin;
      const ParallelGroups groups = initialize_parallel_groups(*world, config);
      ParallelAttention attention(groups, {batch, seq, heads, kv_heads, dim, DType::kBF16, gpu, 128, 64});
      const SequenceSharding& sharding = attention.sharding();
      const int64_t L = sharding.shard_length;
      Tensor qs = Tensor::empty({batch, L, heads, dim}, DType::kBF16, gpu);
      Tensor ks = Tensor::empty({batch, L, kv_heads, dim}, DType::kBF16, gpu), vs = Tensor::empty(ks.shape(), DType::kBF16, gpu);
      take_shard(ctx, sharding, rank, q, qs);
      take_shard(ctx, sharding, rank, k, ks);
      take_shard(ctx, sharding, rank, v, vs);
      for (size_t m = 0; m < masks.size(); ++m) {
        const BlockMask& mask = masks[m].second;
        SCOPED_TRACE(detail::concat("rank ", rank, " ", masks[m].first, ", ", head_groups, " head groups, sm margin ", sm_margin));
        Tensor poison = Tensor::empty(qs.shape(), DType::kBF16);
        fill(poison, std::nan(""));
        const Tensor out = poison.to(gpu);
        const auto plan = mask.nnz() > 0 ? attention.plan_mask(mask) : nullptr;
        attention.forward(ctx, qs, ks, vs, out, plan.get());
        Tensor expected = Tensor::empty(out.shape(), DType::kBF16, gpu);
        take_shard(ctx, sharding, rank, wholes[m], expected);
        const Tensor got = out.to(Device::cpu());
        if (head_groups == 1) {
          EXPECT_LE(max_abs_difference(got, expected), 2e-2);
          one_group[m] = got;
        } else {
          EXPECT_EQ(std::memcmp(got.data(), one_group[m].data(), got.nbytes()), 0) << "differs from one group's output";
        }
      }
    }
  };
  // An error on one rank fails the test instead of ending the process (the other rank's NCCL calls
  // then wait for it: the test's timeout ends them).
  auto rank_body = [&](int rank) {
    try {
      rank_steps(rank);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << ": " << e.what();
    }
  };
  std::thread second(rank_body, 1);
  rank_body(0);
  second.join();
}

}  // namespace
}  // namespace tessel
