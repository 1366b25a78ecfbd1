// The Wan transformer's bf16 CUDA forward against diffusers and against its own fp32 CPU forward.
//
// Fixture (tests/fixtures/wan_gpu, scripts/make_wan_fixture.py --gpu: 2 layers, 2 heads of 64, an
// odd 3 x 5 x 3 patch grid, batch 2 with different timesteps, bf16-stored weights): the CUDA
// forward's error against diffusers' float64 forward of those weights stays within 2x the error of
// diffusers' own bf16 forward (FlashAttention's rule; diffusers bf16 measures 5.4e-3 there).
//
// Random tiny configs with odd latent patch grids, batch 1 and 2, per-batch, per-frame and
// per-token timesteps, with and without the affine cross-attention norm, and with Wan 2.1 I2V's and FLF2V's
// image branch (36 input channels, odd image token counts, FLF2V's position table), against the CPU
// fp32 forward on the same weights (which the CPU parity tests hold to diffusers: wan_parity_test,
// wan_i2v_parity_test).
//
// Yardstick: the CPU fp32 forward run on what the CUDA model rounds at its inputs — the weights it
// keeps in bf16 (wan_cuda_weight_dtype) and the latents and text — differs from the plain fp32
// forward by E_round: the error bf16 storage alone implies. The CUDA forward also rounds the
// operands of every GEMM and attention to bf16 (about as many rounding sites again, with the
// residual stream and the conditioning kept in fp32), so its error is expected near 2 x E_round;
// the bound is 3 x E_round. A wrong formula (RoPE pair order, a modulation chunk, a missed norm)
// moves the output by more than 1e-1 on these configs, E_round is a few 1e-3. The image features
// enter the CUDA forward in fp32 (rounded after the embedder's first norm), so the yardstick keeps
// them as they are. That the image branch is exercised: with a zero image the CUDA output is far
// (10 x the bound) from the reference.
//
// Also: the workspace is sized by the first forward and not grown by the next; a forward is
// deterministic; the whole forward replays from a captured CUDA graph with the same output.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/core/exec_context.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/random.h"
#include "dit_test_util.h"
#include "wan_tiny_cases.h"
#include "tessel/dit/wan_model.h"
#include "tessel/dit/wan_weights.h"
#include "tessel/sparse/builtin_backends.h"
#include "tessel/sparse/config.h"
#include "tessel/sparse/registry.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace tessel {
namespace {

using wan_test::Case;
using wan_test::cases;
using wan_test::Inputs;
using wan_test::output_shape;
using wan_test::Timesteps;
using wan_test::tiny_config;
using wan_test::with_image_branch;

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

Tensor bf16_rounded(const Tensor& t) { return t.to(DType::kBF16).to(DType::kF32); }

Tensor cpu_forward(const WanTransformer& model, const Tensor& latents, const Tensor& timestep, const Tensor& text,
                   const Tensor& image = {}) {
  Tensor out = Tensor::empty(output_shape(model.config(), latents), DType::kF32);
  ExecContext ctx;
  ctx.num_threads = 1;
  if (image.defined())
    model.forward(ctx, StepInfo{}, latents, timestep, text, image, out);
  else
    model.forward(ctx, StepInfo{}, latents, timestep, text, out);
  return out;
}

// The CUDA forward under `ctx` (its workspace), into a poisoned output, copied back to the host.
// `image`, when given, replaces the inputs' image.
Tensor cuda_forward(const ExecContext& ctx, const WanTransformer& model, const Inputs& in, const StepInfo& step = {},
                    WanForwardProfile* profile = nullptr, const Tensor* image = nullptr) {
  const Device gpu = Device::cuda();
  const Tensor latents = in.latents.to(gpu), timestep = in.timestep.to(gpu), text = in.text.to(gpu);
  Tensor poison = Tensor::empty(output_shape(model.config(), in.latents), DType::kF32);
  fill(poison.view(), std::nan(""));
  Tensor out = poison.to(gpu);
  const Tensor& host_image = image != nullptr ? *image : in.image;
  if (host_image.defined())
    model.forward(ctx, step, latents, timestep, text, host_image.to(gpu), out, profile);
  else
    model.forward(ctx, step, latents, timestep, text, out, profile);
  return out.to(Device::cpu());
}

TEST(WanCuda, FixtureWithinTwiceDiffusersBf16Error) {
  SKIP_WITHOUT_GPU();
  const std::filesystem::path dir = wan_gpu_fixture_dir();
  const SafetensorsFile file = SafetensorsFile::open((dir / "io.safetensors").string());
  const Device gpu = Device::cuda();
  const Tensor exact = file.load("output_fp64"), diffusers_bf16 = file.load("output_bf16");
  const WanTransformer model = WanTransformer::load((dir / "checkpoint_bf16").string(), {}, gpu);
  Tensor out = Tensor::zeros(exact.shape(), DType::kF32, gpu);
  ExecContext ctx;
  ctx.device = gpu;
  model.forward(ctx, StepInfo{}, file.load("hidden_states").to(gpu), file.load("timestep").to(gpu),
                file.load("encoder_hidden_states").to(gpu), out);
  const double error = rel_l2(out.to(Device::cpu()), exact), diffusers_error = rel_l2(diffusers_bf16, exact);
  std::printf("fixture: tessel CUDA bf16 vs float64 rel-L2 %.3e; diffusers bf16 %.3e; ratio %.2f\n", error, diffusers_error,
              error / diffusers_error);
  EXPECT_LE(error, 2.0 * diffusers_error);
}

TEST(WanCuda, Bf16ForwardMatchesCpuFp32WithinTheBf16RoundingBound) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto weights = random_wan_weights(c.config, seed += 50);
    const Inputs in(c, seed);
    const Tensor reference = cpu_forward(WanTransformer(c.config, weights), in.latents, in.timestep, in.text, in.image);

    std::map<std::string, Tensor> rounded_weights;
    for (const auto& [name, tensor] : weights)
      rounded_weights.emplace(name, wan_cuda_weight_dtype(name) == DType::kBF16 ? bf16_rounded(tensor) : tensor.clone());
    const Tensor rounded = cpu_forward(WanTransformer(c.config, rounded_weights), bf16_rounded(in.latents), in.timestep,
                                       bf16_rounded(in.text), in.image);
    const double yardstick = rel_l2(rounded, reference);

    Workspace workspace(Device::cuda());
    ExecContext ctx;
    ctx.device = Device::cuda();
    ctx.workspace = &workspace;
    const WanTransformer model(c.config, weights, {}, Device::cuda());
    const Tensor out = cuda_forward(ctx, model, in);
    const double error = rel_l2(out, reference);
    std::printf("[%s] CUDA bf16 vs CPU fp32: rel-L2 %.3e; bf16 storage alone (CPU): %.3e; ratio %.2f\n", c.name.c_str(), error,
                yardstick, error / yardstick);
    EXPECT_GT(yardstick, 1e-5);  // the yardstick measures something
    EXPECT_LE(error, 3.0 * yardstick);
    if (in.image.defined()) {
      Tensor zero_image = Tensor::zeros(in.image.shape(), DType::kF32);
      const double without_image = rel_l2(cuda_forward(ctx, model, in, {}, nullptr, &zero_image), reference);
      std::printf("[%s] CUDA with a zero image vs CPU fp32: rel-L2 %.3e\n", c.name.c_str(), without_image);
      EXPECT_GT(without_image, 30.0 * yardstick);
    }
  }
}

// Text to video and FLF2V (the image branch's buffers and position table).
std::vector<Case> workspace_and_graph_cases() { return {cases()[0], cases()[5]}; }

TEST(WanCuda, WorkspaceIsSizedOnceAndForwardIsDeterministic) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : workspace_and_graph_cases()) {
    SCOPED_TRACE(c.name);
    const WanTransformer model(c.config, random_wan_weights(c.config, 7), {}, Device::cuda());
    const Inputs in(c, 7);
    Workspace workspace(Device::cuda());
    ExecContext ctx;
    ctx.device = Device::cuda();
    ctx.workspace = &workspace;
    const Tensor first = cuda_forward(ctx, model, in);
    const size_t capacity = workspace.capacity();
    const std::byte* base = workspace.data();
    const size_t activations = model.workspace_bytes(ctx, c.batch, c.frames, c.height, c.width, c.text_len, false, c.image_len);
    EXPECT_GE(capacity, activations);
    if (c.image_len > 0)  // the image branch's activations are counted
      EXPECT_GT(activations, model.workspace_bytes(ctx, c.batch, c.frames, c.height, c.width, c.text_len));
    const Tensor second = cuda_forward(ctx, model, in);
    EXPECT_EQ(workspace.capacity(), capacity);
    EXPECT_EQ(workspace.data(), base);
    EXPECT_EQ(std::memcmp(first.data(), second.data(), first.nbytes()), 0);
  }
}

TEST(WanCuda, SelfAttentionThroughSparseModulesWithWarmupAndPerBlockConfigs) {
  SKIP_WITHOUT_GPU();
  // 768 tokens (a 3 x 16 x 16 patch grid): several 128-token query blocks for a sparse pattern.
  const Case c{"2x64_batch2_grid3x16x16", tiny_config(2, 64, 256, 48, 2, true), 2, 3, 32, 32, 7, Timesteps::kPerEntry};
  const auto weights = random_wan_weights(c.config, 11);
  const Inputs in(c, 11);
  BackendRegistry registry(false);
  register_builtin_backends(registry);
  ExecContext ctx;
  ctx.device = Device::cuda();
  const Tensor dense = cuda_forward(ctx, WanTransformer(c.config, weights, {}, Device::cuda()), in);

  // dynamic_topk ranking every block (random tokens are not self-similar), estimated on the device,
  // sparse from step 1 on.
  WanAttentionOptions topk;
  topk.registry = &registry;
  topk.config = parse_sparse_attn_json(R"({"backend": "dynamic_topk", "pattern": {"type": "dynamic_topk"},
      "selection": {"topk_ratio": 0.3}, "options": {"similarity_threshold": "-2"}, "warmup": {"dense_steps": 1}})");
  const WanTransformer sparse(c.config, weights, topk, Device::cuda());
  // Step 0 is the dense warm-up: the same kernel on the same operands as the direct path.
  const Tensor warmup = cuda_forward(ctx, sparse, in, StepInfo::at(0, 4));
  EXPECT_EQ(std::memcmp(dense.data(), warmup.data(), dense.nbytes()), 0);
  WanForwardProfile profile;
  const double sparse_error = rel_l2(cuda_forward(ctx, sparse, in, StepInfo::at(1, 4), &profile), dense);
  std::printf("dynamic_topk 0.3 on 768 tokens at step 1: rel-L2 vs dense %.3e, density %.3f\n", sparse_error,
              profile.mean_self_attention_density());
  EXPECT_TRUE(std::isfinite(sparse_error));
  EXPECT_GT(sparse_error, 1e-4);
  EXPECT_EQ(profile.dense_self_attention_calls, 0);
  EXPECT_LT(profile.mean_self_attention_density(), 1.0);

  // radial (a static mask over the latent's patch grid) runs and stays finite.
  WanAttentionOptions radial;
  radial.registry = &registry;
  radial.config = parse_sparse_attn_json(R"({"backend": "radial", "pattern": {"type": "radial"}})");
  radial.config.geometry.spatial_layout = wan_spatial_layout(c.config, c.frames, c.height, c.width);
  EXPECT_TRUE(std::isfinite(rel_l2(cuda_forward(ctx, WanTransformer(c.config, weights, radial, Device::cuda()), in), dense)));

  // Both blocks configured back to dense give the dense output at a sparse step.
  WanAttentionOptions per_block = topk;
  per_block.layer_configs[0] = parse_sparse_attn_json(R"({"backend": "none"})");
  per_block.layer_configs[1] = parse_sparse_attn_json(R"({"backend": "none"})");
  const Tensor all_dense = cuda_forward(ctx, WanTransformer(c.config, weights, per_block, Device::cuda()), in, StepInfo::at(1, 4));
  EXPECT_EQ(std::memcmp(dense.data(), all_dense.data(), dense.nbytes()), 0);
}

#ifdef TESSEL_WITH_CUDA
TEST(WanCuda, ForwardReplaysFromACapturedCudaGraph) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : workspace_and_graph_cases()) {
    SCOPED_TRACE(c.name);
    const WanTransformer model(c.config, random_wan_weights(c.config, 13), {}, Device::cuda());
    const Inputs in(c, 13);
    const Device gpu = Device::cuda();
    const Tensor latents = in.latents.to(gpu), timestep = in.timestep.to(gpu), text = in.text.to(gpu);
    const Tensor image = in.image.defined() ? in.image.to(gpu) : Tensor{};
    Tensor out = Tensor::zeros(output_shape(c.config, in.latents), DType::kF32, gpu);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    Workspace workspace(gpu);
    ExecContext ctx;
    ctx.device = gpu;
    ctx.stream = stream;
    ctx.workspace = &workspace;
    const auto run = [&] {
      if (image.defined())
        model.forward(ctx, StepInfo{}, latents, timestep, text, image, out);
      else
        model.forward(ctx, StepInfo{}, latents, timestep, text, out);
    };
    // The first forward sizes the workspace and picks the GEMM algorithms; the captured one only launches.
    run();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const Tensor eager = out.to(Device::cpu());
    ASSERT_EQ(cudaMemsetAsync(out.data(), 0, out.nbytes(), stream), cudaSuccess);
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    run();
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const Tensor replayed = out.to(Device::cpu());
    EXPECT_EQ(std::memcmp(eager.data(), replayed.data(), eager.nbytes()), 0);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}
#endif

// Offloaded blocks (WanWeightResidency::kOffloadBlocks): the same weights drawn in the same order,
// the same kernels on bytes copied from pinned host memory, so every output equals the in-memory
// model's bit for bit, over several forwards of several shapes (blocks cycling through the two
// slots, and back to block 0 at the next forward); the device holds two blocks.
TEST(WanCudaOffload, OffloadedBlocksGiveTheInMemoryOutputBitForBit) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    WanConfig config = c.config;
    config.num_layers = 5;  // an odd count: the last block's slot is not the first's
    const WanTransformer resident = WanTransformer::random(config, 29, {}, Device::cuda(), WanWeightResidency::kDevice);
    const WanTransformer offloaded = WanTransformer::random(config, 29, {}, Device::cuda(), WanWeightResidency::kOffloadBlocks);
    EXPECT_EQ(resident.offloaded_weight_bytes(), 0u);
    EXPECT_GT(offloaded.offloaded_weight_bytes(), 0u);
    // The device keeps the resident tensors and two of the five blocks.
    const size_t block = offloaded.offloaded_weight_bytes() / 5;
    EXPECT_EQ(offloaded.weight_bytes() + offloaded.offloaded_weight_bytes(), resident.weight_bytes() + 2 * block);
    Case run = c;
    run.config = config;
    for (uint64_t seed : {31u, 37u}) {
      const Inputs in(run, seed);
      Workspace a(Device::cuda()), b(Device::cuda());
      ExecContext ctx_a, ctx_b;
      ctx_a.device = ctx_b.device = Device::cuda();
      ctx_a.workspace = &a;
      ctx_b.workspace = &b;
      const Tensor expected = cuda_forward(ctx_a, resident, in);
      const Tensor actual = cuda_forward(ctx_b, offloaded, in);
      ASSERT_EQ(expected.nbytes(), actual.nbytes());
      EXPECT_EQ(std::memcmp(expected.data(), actual.data(), expected.nbytes()), 0) << "seed " << seed;
    }
  }
}

#ifdef TESSEL_WITH_CUDA
TEST(WanCudaOffload, AModelWithOffloadedBlocksRefusesAGraphCapture) {
  SKIP_WITHOUT_GPU();
  const Case c = cases()[0];
  const WanTransformer model = WanTransformer::random(c.config, 3, {}, Device::cuda(), WanWeightResidency::kOffloadBlocks);
  const Inputs in(c, 3);
  const Device gpu = Device::cuda();
  const Tensor latents = in.latents.to(gpu), timestep = in.timestep.to(gpu), text = in.text.to(gpu);
  Tensor out = Tensor::zeros(in.latents.shape(), DType::kF32, gpu);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ExecContext ctx;
  ctx.device = gpu;
  ctx.stream = stream;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  std::string message;
  try {
    model.forward(ctx, StepInfo{}, latents, timestep, text, out);
  } catch (const Error& e) {
    message = e.what();
  }
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  EXPECT_NE(message.find("offloaded blocks"), std::string::npos) << message;
}
#endif

// Offload is a CUDA placement: the CPU model refuses it, naming it.
TEST(WanCudaOffload, TheCpuModelRefusesOffloadedBlocks) {
  const Case c = cases()[0];
  try {
    (void)WanTransformer::random(c.config, 1, {}, Device::cpu(), WanWeightResidency::kOffloadBlocks);
    FAIL() << "a CPU model took offloaded blocks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block offload"), std::string::npos) << e.what();
  }
}

TEST(WanCuda, RejectsHostTensorsForADeviceModel) {
  SKIP_WITHOUT_GPU();
  const Case c = cases()[0];
  const WanTransformer model(c.config, random_wan_weights(c.config, 17), {}, Device::cuda());
  const Inputs in(c, 17);
  Tensor out = Tensor::empty(in.latents.shape(), DType::kF32);
  try {
    model.forward(ExecContext{}, StepInfo{}, in.latents, in.timestep, in.text, out);
    FAIL() << "host latents were accepted by a CUDA model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("latents"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel
