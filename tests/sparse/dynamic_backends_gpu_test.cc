// The dynamic pattern backends (dynamic_topk, threshold) on CUDA tensors, through the registry:
// the mask is estimated on the device (no host fallback) and the output equals the fp64 reference
// on that mask; the masks agree with the CPU backend's in density; statistics arrive lazily; a
// CUDA-graph capture of forward replays to the same output; unsupported options are errors at
// plan time. Skips (with a message) when no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sparse/pattern_test_util.h"
#include "sparse/sparse_test_util.h"
#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/core/tensor.h"
#include "tessel/sparse/config.h"
#include "tessel/sparse/mask_planning.h"
#include "tessel/sparse/pattern_backends.h"
#include "tessel/sparse/registry.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>

#endif

namespace tessel {
namespace {

using testing::builtins;
using testing::Qkv;

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

constexpr int64_t kBatch = 1, kSeq = 1000, kHeads = 4, kKvHeads = 2, kDim = 128;

// 128x64 blocks (threshold's stride 8 at head dim 128 allows them on CUDA); similarity -2 makes
// dynamic_topk rank the blocks of these unstructured inputs instead of keeping whole rows.
PatternSpec spec_for(const std::string& pattern) {
  SparseAttnConfig c;
  c.pattern.type = parse_pattern_type(pattern);
  c.selection.topk_ratio = 0.3;
  c.selection.threshold = 0.7;  // about 3/4 of the blocks of these near-uniform rows
  c.selection.stride = 8;
  c.selection.keep_diagonal = true;
  c.selection.sink_blocks = 1;
  c.options["similarity_threshold"] = "-2";
  return ResolvedSparseAttnConfig(c).pattern();
}

struct DeviceQkv {
  Qkv host;
  Tensor q, k, v;
};

DeviceQkv inputs(uint64_t seed) {
  DeviceQkv t{testing::random_qkv(kBatch, kSeq, kSeq, kHeads, kKvHeads, kDim, DType::kBF16, seed), {}, {}, {}};
  t.q = t.host.q.to(Device::cuda());
  t.k = t.host.k.to(Device::cuda());
  t.v = t.host.v.to(Device::cuda());
  return t;
}

// A CUDA plan of `pattern` through the registry, with its inputs and an Impl.
struct DevicePlan {
  PatternSpec spec;
  DeviceQkv t;
  std::shared_ptr<Metadata> metadata;
  std::unique_ptr<Impl> impl;
};

DevicePlan plan_on_device(const std::string& pattern, uint64_t seed) {
  DevicePlan p{spec_for(pattern), inputs(seed), nullptr, nullptr};
  const std::shared_ptr<Backend> backend = builtins().get(pattern);
  p.metadata = backend->make_metadata_builder()->plan(ExecContext{}, p.spec, ModuleType::kDitSelf, AttentionShape::of(p.t.q, p.t.k, p.t.v));
  p.impl = backend->make_impl();
  return p;
}

// The CPU backend's mask for the same inputs: host estimator plus the always-keep union.
BlockMask cpu_mask(const std::string& pattern, const PatternSpec& spec, const Qkv& host) {
  const BlockMask estimated = pattern == "dynamic_topk"
                                  ? estimate_topk_mask(ExecContext{}, host.q, host.k, topk_options_from_spec(spec)).mask
                                  : estimate_xattention_mask(ExecContext{}, host.q, host.k, xattention_options_from_spec(spec)).mask;
  return apply_always_keep(spec, estimated);
}

TEST(DynamicBackendsGpu, OutputMatchesTheReferenceOnTheDeviceMask) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 11;
  for (const std::string pattern : {"dynamic_topk", "threshold"}) {
    SCOPED_TRACE(pattern);
    const DevicePlan p = plan_on_device(pattern, seed++);
    const PatternSpec& spec = p.spec;
    const DeviceQkv& t = p.t;
    const std::shared_ptr<Metadata>& metadata = p.metadata;
    Impl* impl = p.impl.get();
    Tensor out = testing::poisoned({kBatch, kSeq, kHeads, kDim}, DType::kBF16).to(Device::cuda());
    Tensor lse = testing::poisoned({kBatch, kHeads, kSeq}, DType::kF32).to(Device::cuda());

    const ForwardStats first = impl->forward(ExecContext{}, t.q, t.k, t.v, *metadata, StepInfo{}, out, lse);
    EXPECT_EQ(first.estimate_ms, 0.0) << "no earlier forward of this plan has finished";
    EXPECT_EQ(first.density, metadata->planned_density());

    const BlockMask mask = device_estimated_mask(*metadata);  // synchronizes; from_csr validates the CSR
    EXPECT_GT(mask.density(), 0.0);
    EXPECT_LT(mask.density(), 1.0) << "inputs should make a nontrivial mask";
    const int64_t q_blocks = mask.shape().q_blocks();
    for (int64_t r = 0; r < mask.shape().num_rows(); ++r)  // always-keep: block 0 (sink) in every row
      EXPECT_EQ(mask.row(0, r / q_blocks, r % q_blocks).front(), 0) << "row " << r;
    testing::expect_matches_masked_reference(t.host, mask, out.to(Device::cpu()), lse.to(Device::cpu()));

    // Same definitions as the CPU backend: near-ties may move single blocks, not the density.
    EXPECT_NEAR(mask.density(), cpu_mask(pattern, spec, t.host).density(), 0.02);

    // The second forward reports the first one's measurement (finished: to_host synchronized).
    const ForwardStats second = impl->forward(ExecContext{}, t.q, t.k, t.v, *metadata, StepInfo{}, out, lse);
    EXPECT_NEAR(second.density, mask.density(), 1e-12);
    EXPECT_GT(second.estimate_ms, 0.0);
  }
}

// What sequence parallelism cuts per rank: executed_mask on CUDA tensors is the device
// estimator's mask, on the host, the one forward() attends with (the same mask twice, since the
// estimators are deterministic), and repeated calls give the same mask.
TEST(DynamicBackendsGpu, ExecutedMaskIsTheMaskForwardAttendsWith) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 51;
  for (const std::string pattern : {"dynamic_topk", "threshold"}) {
    SCOPED_TRACE(pattern);
    const DevicePlan p = plan_on_device(pattern, seed++);
    const std::optional<BlockMask> executed = p.impl->executed_mask(ExecContext{}, p.t.q, p.t.k, *p.metadata, StepInfo{});
    ASSERT_TRUE(executed.has_value());
    EXPECT_GT(executed->density(), 0.0);
    EXPECT_LT(executed->density(), 1.0);
    const std::optional<BlockMask> again = p.impl->executed_mask(ExecContext{}, p.t.q, p.t.k, *p.metadata, StepInfo{});
    ASSERT_TRUE(again.has_value());
    EXPECT_EQ(again->indptr(), executed->indptr());
    EXPECT_EQ(again->indices(), executed->indices());
    Tensor out = testing::poisoned({kBatch, kSeq, kHeads, kDim}, DType::kBF16).to(Device::cuda());
    p.impl->forward(ExecContext{}, p.t.q, p.t.k, p.t.v, *p.metadata, StepInfo{}, out, {});
    const BlockMask attended = device_estimated_mask(*p.metadata);
    EXPECT_EQ(attended.indptr(), executed->indptr());
    EXPECT_EQ(attended.indices(), executed->indices());
  }
}

#ifdef TESSEL_WITH_CUDA
TEST(DynamicBackendsGpu, GraphCaptureOfForwardReplays) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 31;
  for (const std::string pattern : {"dynamic_topk", "threshold"}) {
    SCOPED_TRACE(pattern);
    const DevicePlan p = plan_on_device(pattern, seed++);
    const DeviceQkv& t = p.t;
    const std::shared_ptr<Metadata>& metadata = p.metadata;
    Impl* impl = p.impl.get();
    Tensor eager = Tensor::empty({kBatch, kSeq, kHeads, kDim}, DType::kBF16, Device::cuda());
    Tensor graphed = testing::poisoned({kBatch, kSeq, kHeads, kDim}, DType::kBF16).to(Device::cuda());
    impl->forward(ExecContext{}, t.q, t.k, t.v, *metadata, StepInfo{}, eager, {});
    const BlockMask eager_mask = device_estimated_mask(*metadata);

    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    {
      ExecContext on_stream;
      on_stream.device = Device::cuda();
      on_stream.stream = stream;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
      impl->forward(on_stream, t.q, t.k, t.v, *metadata, StepInfo{}, graphed, {});
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    }
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int i = 0; i < 2; ++i) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const BlockMask graph_mask = device_estimated_mask(*metadata);
    EXPECT_EQ(eager_mask.indptr(), graph_mask.indptr());
    EXPECT_EQ(eager_mask.indices(), graph_mask.indices());
    const Tensor x = eager.to(Device::cpu()), y = graphed.to(Device::cpu());
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.nbytes()), 0) << "graph replay differs from the eager forward";
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}
#endif

TEST(DynamicBackendsGpu, UnsupportedOptionsAreErrorsAtPlanTime) {
  SKIP_WITHOUT_GPU();
  AttentionShape shape;
  shape.batch = kBatch;
  shape.num_qo_heads = kHeads;
  shape.num_kv_heads = kKvHeads;
  shape.head_dim = kDim;
  shape.seq_q = shape.seq_kv = kSeq;
  shape.dtype = DType::kBF16;
  shape.device = Device::cuda();
  auto plan = [&](const std::string& pattern, const PatternSpec& spec, const AttentionShape& s) {
    builtins().get(pattern)->make_metadata_builder()->plan(ExecContext{}, spec, ModuleType::kDitSelf, s);
  };
  auto with_option = [](const std::string& pattern, const std::string& key, const std::string& value) {
    PatternSpec spec = spec_for(pattern);
    spec.options[key] = value;
    return spec;
  };
  testing::expect_error([&] { plan("threshold", with_option("threshold", "vote", "heads"), shape); }, "pattern.options.vote");
  testing::expect_error([&] { plan("threshold", with_option("threshold", "gqa_any", "true"), shape); },
                        "pattern.options.gqa_any");
  testing::expect_error([&] { plan("threshold", with_option("threshold", "per_head_threshold", "0.9,0.9,0.8,0.8"), shape); },
                        "pattern.options.per_head_threshold");
  PatternSpec stride32 = spec_for("threshold");
  stride32.stride = 32;  // 64-token kv blocks hold 2 groups of 32: below the device's 4
  testing::expect_error([&] { plan("threshold", stride32, shape); }, "pattern.stride");
  PatternSpec sinks = spec_for("threshold");
  sinks.sink_blocks = 2;
  testing::expect_error([&] { plan("threshold", sinks, shape); }, "pattern.sink_blocks");
  testing::expect_error([&] { plan("dynamic_topk", with_option("dynamic_topk", "per_head", "0.1,0.2,0.3,0.4"), shape); },
                        "pattern.options.per_head");
  PatternSpec text = spec_for("dynamic_topk");
  text.keep_text = true;
  text.num_text_tokens = 100;
  testing::expect_error([&] { plan("dynamic_topk", text, shape); }, "pattern.keep_text");
  AttentionShape fp32 = shape;
  fp32.dtype = DType::kF32;
  testing::expect_error([&] { plan("threshold", spec_for("threshold"), fp32); }, "dtype");
  // The CPU plan of the same spec has no device mask to read.
  AttentionShape cpu = shape;
  cpu.device = Device::cpu();
  const std::shared_ptr<Metadata> cpu_plan =
      builtins().get("dynamic_topk")->make_metadata_builder()->plan(ExecContext{}, spec_for("dynamic_topk"), ModuleType::kDitSelf, cpu);
  testing::expect_error([&] { device_estimated_mask(*cpu_plan); }, "a CUDA plan");
}

}  // namespace
}  // namespace tessel
