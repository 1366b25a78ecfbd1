// The device dynamic_topk estimator against the CPU estimator (same definition) on structured
// random inputs, and CUDA-graph capture of estimation + block-sparse attention. Skips (with a
// message) when no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "tessel/core/tensor.h"
#include "tessel/kernels/attention.h"
#include "tessel/sparse/estimators/device_mask_estimation.h"
#include "tessel/sparse/estimators/topk_estimator.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>

#endif

namespace tessel {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

// Tokens = a per-segment center + noise, so blocks are self-similar to a varying degree (as
// neighbouring video tokens are), with some pure-noise segments that are not.
Tensor structured(int64_t batch, int64_t seq, int64_t heads, int64_t dim, int64_t segment, uint64_t seed) {
  Tensor noise = Tensor::empty({batch, seq, heads, dim}, DType::kF32);
  fill_normal(noise.view(), seed);
  const int64_t segments = (seq + segment - 1) / segment;
  Tensor centers = Tensor::empty({batch, segments, heads, dim}, DType::kF32);
  fill_normal(centers.view(), seed + 17, 0.0, 2.0);
  float* x = noise.data_as<float>();
  const float* c = centers.data_as<const float>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s) {
      const int64_t g = s / segment;
      const float weight = g % 5 == 3 ? 0.0f : 1.0f;  // every 5th segment is noise only
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < dim; ++d)
          x[((b * seq + s) * heads + h) * dim + d] += weight * c[((b * segments + g) * heads + h) * dim + d];
    }
  return noise.to(DType::kBF16);
}

struct Case {
  int64_t batch, seq_q, seq_kv, heads, kv_heads, dim;
  TopkEstimatorOptions options;
};

// Fraction of blocks on which the device and the CPU masks disagree.
double disagreement(const BlockMask& a, const BlockMask& b) {
  const std::vector<uint8_t> da = a.to_dense(), db = b.to_dense();
  size_t differ = 0;
  for (size_t i = 0; i < da.size(); ++i) differ += (da[i] != 0) != (db[i] != 0);
  return static_cast<double>(differ) / static_cast<double>(da.size());
}

TEST(TopkEstimatorGpu, MatchesTheCpuEstimator) {
  SKIP_WITHOUT_GPU();
  std::vector<Case> cases;
  TopkEstimatorOptions topk;
  topk.topk_ratio = 0.3;
  cases.push_back({1, 1000, 1000, 4, 2, 128, topk});
  TopkEstimatorOptions cdf;
  cdf.cdf_threshold = 0.9;
  cdf.keep.diagonal = true;
  cdf.keep.sink_blocks = 1;
  cases.push_back({2, 777, 900, 2, 1, 64, cdf});
  TopkEstimatorOptions all_similar;
  all_similar.similarity_threshold = -1.0;
  all_similar.topk_ratio = 0.25;
  all_similar.block_q = 64;
  cases.push_back({1, 640, 640, 2, 2, 128, all_similar});
  // The pooling kernel has one instance per (smoothing, rule) pair: the cases above use the
  // defaults (smoothed, kSpargeAttn); these take the other three, with partial last blocks.
  TopkEstimatorOptions reach_target = topk;
  reach_target.rule = TopkRule::kReachTarget;
  reach_target.smooth_k = false;
  cases.push_back({1, 1111, 1000, 4, 2, 128, reach_target});
  TopkEstimatorOptions reach_target_smoothed = reach_target;
  reach_target_smoothed.smooth_k = true;
  reach_target_smoothed.topk_ratio = 0.4;
  cases.push_back({2, 700, 833, 2, 1, 96, reach_target_smoothed});
  TopkEstimatorOptions unsmoothed_cdf = cdf;
  unsmoothed_cdf.smooth_k = false;
  cases.push_back({1, 900, 950, 4, 4, 64, unsmoothed_cdf});
  uint64_t seed = 3;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.batch << " S=" << c.seq_q << "/" << c.seq_kv << " D=" << c.dim
                                      << " cdf=" << c.options.cdf_threshold << " ratio=" << c.options.topk_ratio
                                      << " smooth_k=" << c.options.smooth_k << " rule="
                                      << (c.options.rule == TopkRule::kSpargeAttn ? "spargeattn" : "reach-target"));
    const Tensor q = structured(c.batch, c.seq_q, c.heads, c.dim, 96, seed++);
    const Tensor k = structured(c.batch, c.seq_kv, c.kv_heads, c.dim, 80, seed++);
    const BlockMask cpu = estimate_topk_mask(ExecContext{}, q, k, c.options).mask;
    const BlockMaskShape shape{c.batch, c.heads, c.seq_q, c.seq_kv, c.options.block_q, c.options.block_kv};
    DeviceEstimatedMask device_mask(shape, c.kv_heads, c.dim, Device::cuda());
    estimate_topk_mask_device(ExecContext{}, q.to(Device::cuda()), k.to(Device::cuda()), c.options, device_mask);
    const BlockMask gpu = device_mask.to_host();  // from_csr validates: sorted, unique, in range
    EXPECT_GT(cpu.density(), 0.0);
    EXPECT_LT(cpu.density(), 1.0) << "inputs should make a nontrivial mask";
    EXPECT_LE(disagreement(cpu, gpu), 0.01) << "cpu density " << cpu.density() << ", gpu " << gpu.density();
    if (c.options.similarity_threshold <= -1.0 && !c.options.keep.any()) {
      // Every row keeps exactly the rule's count (all blocks whole and self-similar here).
      const int64_t n = topk_count(c.options.rule, c.options.topk_ratio, shape.kv_blocks());
      for (int64_t r = 0; r < shape.num_rows(); ++r)
        EXPECT_EQ(gpu.indptr()[r + 1] - gpu.indptr()[r], n) << "row " << r;
    }
  }
}

TEST(TopkEstimatorGpu, RejectsAMaskOfAnotherShape) {
  SKIP_WITHOUT_GPU();
  const Tensor q = Tensor::empty({1, 256, 2, 64}, DType::kBF16, Device::cuda());
  DeviceEstimatedMask wrong({1, 2, 512, 512, 128, 64}, 2, 64, Device::cuda());
  try {
    estimate_topk_mask_device(ExecContext{}, q, q, {}, wrong);
    ADD_FAILURE() << "expected tessel::Error naming mask";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mask"), std::string::npos) << e.what();
  }
}

#ifdef TESSEL_WITH_CUDA
TEST(TopkEstimatorGpu, GraphCaptureOfEstimationAndAttentionReplays) {
  SKIP_WITHOUT_GPU();
  const int64_t seq = 900, heads = 4, dim = 128;
  const Device gpu = Device::cuda();
  const Tensor q = structured(1, seq, heads, dim, 96, 41).to(gpu);
  const Tensor k = structured(1, seq, 2, dim, 96, 42).to(gpu);
  const Tensor v = structured(1, seq, 2, dim, 96, 43).to(gpu);
  TopkEstimatorOptions options;
  options.topk_ratio = 0.4;
  options.keep.diagonal = true;
  const BlockMaskShape shape{1, heads, seq, seq, 128, 64};
  DeviceEstimatedMask eager_mask(shape, 2, dim, gpu), graph_mask(shape, 2, dim, gpu);
  Tensor eager = Tensor::empty({1, seq, heads, dim}, DType::kBF16, gpu);
  Tensor graphed = Tensor::empty({1, seq, heads, dim}, DType::kBF16, gpu);
  estimate_topk_mask_device(ExecContext{}, q, k, options, eager_mask);
  block_sparse_attention_forward(ExecContext{}, q, k, v, eager_mask.view(), eager, {});

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  {
    ExecContext on_stream;
    on_stream.device = Device::cuda();
    on_stream.stream = stream;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    estimate_topk_mask_device(on_stream, q, k, options, graph_mask);
    block_sparse_attention_forward(on_stream, q, k, v, graph_mask.view(), graphed, {});
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  }
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 2; ++i) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const BlockMask a = eager_mask.to_host(), b = graph_mask.to_host();
  EXPECT_EQ(a.indptr(), b.indptr());
  EXPECT_EQ(a.indices(), b.indices());
  const Tensor x = eager.to(Device::cpu()), y = graphed.to(Device::cpu());
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.nbytes()), 0) << "graph replay differs from the eager run";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}
#endif

}  // namespace
}  // namespace tessel
