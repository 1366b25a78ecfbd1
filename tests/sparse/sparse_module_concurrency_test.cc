// One SparseAttention module driven by two threads at once, each with its own ExecContext (its
// own workspace), at different denoising steps: every output equals the output of the same call
// made alone. Plans are shared and immutable and the module keeps no per-step state, so nothing
// of one thread's step can leak into the other's (also run under ThreadSanitizer).
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "sparse/sparse_test_util.h"
#include "tessel/core/exec_context.h"
#include "tessel/sparse/schedule.h"
#include "tessel/sparse/sparse_attention.h"

namespace tessel {
namespace {

using namespace tessel::testing;

constexpr int64_t kSteps = 8;
constexpr int kIterations = 12;

SparseAttentionOptions topk_module_options(BackendRegistry& registry) {
  SparseAttentionOptions o;
  o.num_heads = 4;
  o.num_kv_heads = 2;
  o.head_dim = 32;
  o.dtype = DType::kF32;
  o.config.backend = "dynamic_topk";
  o.config.pattern.type = PatternType::kDynamicTopk;
  o.config.geometry.block_q = 32;
  o.config.geometry.block_kv = 32;
  o.config.schedule = "aggressive";  // a different density at every step
  o.config.warmup.dense_steps = 1;   // step 0 takes the dense path
  // Every block counts as self-similar, so the step's top-k ratio decides each row (random data
  // would otherwise keep whole rows).
  o.config.options["similarity_threshold"] = "-1";
  o.registry = &registry;
  return o;
}

// A context of its own: one thread (no nested teams) and a workspace only it uses.
struct ThreadContext {
  Workspace workspace;
  ExecContext ctx;
  ThreadContext() {
    ctx.num_threads = 1;
    ctx.workspace = &workspace;
  }
};

bool same_bytes(const Tensor& a, const Tensor& b) { return std::memcmp(a.data(), b.data(), a.nbytes()) == 0; }

TEST(SparseModuleConcurrency, TwoThreadsAtDifferentStepsMatchTheSequentialRun) {
  const auto owned = builtin_registry();
  BackendRegistry& registry = *owned;
  const SparseAttention module(topk_module_options(registry));
  ASSERT_TRUE(module.resolution().backend);
  const Qkv t = random_qkv(1, 256, 256, 4, 2, 32, DType::kF32, 21);

  // The sequential answer of every step, and that the steps do differ (else the test proves little).
  std::vector<Tensor> expected;
  {
    ThreadContext alone;
    for (int64_t step = 0; step < kSteps; ++step) {
      expected.push_back(Tensor::empty(t.q.shape(), DType::kF32));
      const AttentionStepReport report =
          module.forward(alone.ctx, StepInfo::at(step, kSteps), t.q, t.k, t.v, expected.back(), {});
      EXPECT_EQ(report.dense, step == 0);
    }
  }
  ASSERT_FALSE(same_bytes(expected[1], expected[kSteps - 1]));

  // Thread 0 runs the even steps (CFG branch 0), thread 1 the odd ones (branch 1), many times over.
  std::vector<int> mismatches(2, 0);
  const auto drive = [&](int branch) {
    ThreadContext mine;
    Tensor out = Tensor::empty(t.q.shape(), DType::kF32);
    for (int iteration = 0; iteration < kIterations; ++iteration)
      for (int64_t step = branch; step < kSteps; step += 2) {
        module.forward(mine.ctx, StepInfo::at(step, kSteps, 0, branch), t.q, t.k, t.v, out, {});
        if (!same_bytes(out, expected[static_cast<size_t>(step)])) ++mismatches[static_cast<size_t>(branch)];
      }
  };
  std::thread first(drive, 0), second(drive, 1);
  first.join();
  second.join();
  EXPECT_EQ(mismatches[0], 0);
  EXPECT_EQ(mismatches[1], 0);
}

}  // namespace
}  // namespace tessel
