// One GPU: groups of one rank (the single-rank communicator, and NCCL when built with it) run the
// parallel attention path, dense and block-sparse, and equal the attention kernels called directly;
// the NCCL communicator's operations run on one rank. The multi-GPU layouts are the MPI test's, run
// on several GPUs.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <utility>
#include <vector>

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

}  // namespace
}  // namespace tessel
