// The Wan transformer against diffusers 0.42.1 on the committed fixture (2 layers, 2 heads of 16,
// a 3 x 5 x 3 patch grid, batch 2 with different timesteps), and its attention plumbing: dense
// attention through a registry matches the direct path, sparse attention honours the dense
// warm-up of the StepInfo, bad inputs are rejected.
//
// Tolerance: the fixture's output_fp64 is diffusers' forward in float64, so the fp32 forward's
// difference from it is the fp32 forward's own rounding. diffusers' fp32 forward is 2.4e-7 (rel-L2)
// from it (printed by the fixture script); this forward measures 9e-7 (fp32 GEMMs and attention
// accumulate in another order). The bound 4e-6 is ~16x diffusers' own fp32 error and far below
// what a wrong formula gives: a bf16 rounding of the weights alone moves the output by 3e-3, a
// swapped RoPE pair order or a missed modulation term by more than 1e-2. Against diffusers' own
// fp32 output the bound is 1e-4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "dit_test_util.h"
#include "tessel/core/error.h"
#include "tessel/core/exec_context.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/dit/checkpoint.h"
#include "tessel/dit/wan_model.h"
#include "tessel/dit/wan_weights.h"
#include "tessel/sparse/builtin_backends.h"
#include "tessel/sparse/registry.h"

namespace tessel {
namespace {

struct Fixture {
  std::map<std::string, Tensor> io;
  Fixture() {
    const SafetensorsFile file = SafetensorsFile::open((wan_fixture_dir() / "io.safetensors").string());
    for (const SafetensorsEntry& entry : file.entries()) io.emplace(entry.name, file.load(entry.name));
  }
  // One thread by default: the model is tiny, and a team of threads waits on shared cores.
  Tensor run(const WanTransformer& model, const StepInfo& step = {}, int threads = 1) const {
    Tensor out = Tensor::empty(io.at("output_fp64").shape(), DType::kF32);
    fill(out.view(), std::nan(""));
    ExecContext ctx;
    ctx.num_threads = threads;
    model.forward(ctx, step, io.at("hidden_states"), io.at("timestep"), io.at("encoder_hidden_states"), out);
    return out;
  }
};

TEST(WanParity, ShardedFp32CheckpointMatchesDiffusers) {
  const Fixture fixture;
  const WanTransformer model = WanTransformer::load(wan_fixture_dir() / "checkpoint");
  const Tensor out = fixture.run(model);
  const double vs_fp64 = rel_l2(out, fixture.io.at("output_fp64"));
  const double vs_fp32 = rel_l2(out, fixture.io.at("output_fp32"));
  std::printf("rel-L2 vs diffusers float64: %.3e, vs diffusers fp32: %.3e\n", vs_fp64, vs_fp32);
  EXPECT_LE(vs_fp64, 4e-6);
  EXPECT_LE(vs_fp32, 1e-4);
  // Every output element is computed by one thread in one order whatever the team size.
  const Tensor two_threads = fixture.run(model, {}, 2);
  EXPECT_EQ(std::memcmp(two_threads.data(), out.data(), out.nbytes()), 0);
}

TEST(WanParity, Bf16StoredCheckpointIsCastOnceAndMatches) {
  const Fixture fixture;
  const WanTransformer model = WanTransformer::load(wan_fixture_dir() / "checkpoint_bf16");
  const double error = rel_l2(fixture.run(model), fixture.io.at("output_bf16_weights"));
  std::printf("bf16-stored weights: rel-L2 vs diffusers float64 on the same weights: %.3e\n", error);
  EXPECT_LE(error, 4e-6);
  // The bf16 rounding of the weights itself moves the output far more than that.
  EXPECT_GT(rel_l2(fixture.io.at("output_bf16_weights"), fixture.io.at("output_fp64")), 1e-4);
}

TEST(WanParity, PerTokenTimestepsMatchDiffusers) {
  const Fixture fixture;
  const WanTransformer model = WanTransformer::load(wan_fixture_dir() / "checkpoint");
  Tensor out = Tensor::empty(fixture.io.at("output_fp64").shape(), DType::kF32);
  ExecContext ctx;
  ctx.num_threads = 1;
  model.forward(ctx, {}, fixture.io.at("hidden_states"), fixture.io.at("timestep_per_token"),
                fixture.io.at("encoder_hidden_states"), out);
  const double error = rel_l2(out, fixture.io.at("output_per_token_fp64"));
  std::printf("per-token timesteps: rel-L2 vs diffusers float64 %.3e\n", error);
  EXPECT_LE(error, 4e-6);
  // The first frame's timestep 0 changes the output against one timestep per batch entry.
  EXPECT_GT(rel_l2(fixture.io.at("output_per_token_fp64"), fixture.io.at("output_fp64")), 1e-3);
}

// The same timesteps given once per latent frame (the fixture's per-token ones are constant over
// each frame's 15 tokens): the conditioning runs once per frame, the output is diffusers' per-token
// one. A second dimension that is neither the frames nor the tokens is an Error naming timestep.
TEST(WanParity, PerFrameTimestepsMatchDiffusersPerTokenOnes) {
  const Fixture fixture;
  const WanTransformer model = WanTransformer::load(wan_fixture_dir() / "checkpoint");
  const Tensor& per_token = fixture.io.at("timestep_per_token");
  const int64_t batch = per_token.size(0), tokens = per_token.size(1), frames = fixture.io.at("hidden_states").size(2);
  Tensor per_frame = Tensor::empty({batch, frames}, DType::kF32);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t f = 0; f < frames; ++f)
      per_frame.data_as<float>()[b * frames + f] = per_token.data_as<float>()[b * tokens + f * (tokens / frames)];
  Tensor out = Tensor::empty(fixture.io.at("output_fp64").shape(), DType::kF32);
  fill(out.view(), std::nan(""));
  ExecContext ctx;
  ctx.num_threads = 1;
  model.forward(ctx, {}, fixture.io.at("hidden_states"), per_frame, fixture.io.at("encoder_hidden_states"), out);
  const double error = rel_l2(out, fixture.io.at("output_per_token_fp64"));
  std::printf("per-frame timesteps: rel-L2 vs diffusers' per-token float64 %.3e\n", error);
  EXPECT_LE(error, 4e-6);
  Tensor odd = Tensor::zeros({batch, frames + 1}, DType::kF32);
  try {
    model.forward(ctx, {}, fixture.io.at("hidden_states"), odd, fixture.io.at("encoder_hidden_states"), out);
    FAIL() << "a (B, frames + 1) timestep was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("timestep"), std::string::npos) << e.what();
  }
}

// The CUDA forward's fixture (2 heads of 64, bf16-stored weights; its test is wan_cuda_gpu_test):
// the CPU fp32 forward holds it to diffusers' float64 forward too, so the fixture itself is checked
// where there is no GPU.
TEST(WanParity, GpuFixtureMatchesDiffusersOnTheCpu) {
  const std::filesystem::path dir = wan_gpu_fixture_dir();
  const SafetensorsFile file = SafetensorsFile::open((dir / "io.safetensors").string());
  const Tensor exact = file.load("output_fp64");
  Tensor out = Tensor::empty(exact.shape(), DType::kF32);
  ExecContext ctx;
  ctx.num_threads = 1;
  WanTransformer::load((dir / "checkpoint_bf16").string())
      .forward(ctx, {}, file.load("hidden_states"), file.load("timestep"), file.load("encoder_hidden_states"), out);
  const double error = rel_l2(out, exact);
  std::printf("GPU fixture on the CPU (fp32): rel-L2 vs diffusers float64 %.3e; diffusers bf16 %.3e\n", error,
              rel_l2(file.load("output_bf16"), exact));
  EXPECT_LE(error, 4e-6);
}

WanAttentionOptions attention_through(BackendRegistry& registry, const std::string& json) {
  WanAttentionOptions options;
  options.registry = &registry;
  options.config = parse_sparse_attn_json(json);
  return options;
}

TEST(WanParity, AttentionThroughTheRegistryAndItsStepSchedule) {
  const Fixture fixture;
  BackendRegistry registry(false);
  register_builtin_backends(registry);
  const std::string dir = wan_fixture_dir() / "checkpoint";
  const Tensor dense = fixture.run(WanTransformer::load(dir));

  // Sparse from step 1 on: step 0 is the dense warm-up and must equal dense attention.
  const WanTransformer sparse = WanTransformer::load(
      dir, attention_through(registry, R"({"backend": "sliding_window", "pattern": {"type": "sliding_window", "window_size": 8},
                                           "geometry": {"block_q": 8, "block_kv": 8}, "warmup": {"dense_steps": 1}})"));
  ASSERT_NE(sparse.block_attention(0), nullptr);
  ASSERT_NE(sparse.block_attention(1)->resolution().backend, nullptr);
  EXPECT_EQ(sparse.block_attention(1)->resolution().backend->name(), "sliding_window");
  EXPECT_LE(rel_l2(fixture.run(sparse, StepInfo::at(0, 4)), dense), 1e-6);
  const double sparse_error = rel_l2(fixture.run(sparse, StepInfo::at(1, 4)), dense);
  std::printf("sliding window (8 tokens of 45) at step 1: rel-L2 vs dense %.3e\n", sparse_error);
  EXPECT_GT(sparse_error, 1e-4);
  EXPECT_TRUE(std::isfinite(sparse_error));

  // Per-block configs: both blocks back to dense ("none") give the dense output at a sparse step.
  WanAttentionOptions per_block = attention_through(registry, R"({"backend": "sliding_window", "pattern": {"type": "sliding_window",
                                                               "window_size": 8}, "geometry": {"block_q": 8, "block_kv": 8}})");
  per_block.layer_configs[0] = parse_sparse_attn_json(R"({"backend": "none"})");
  per_block.layer_configs[1] = parse_sparse_attn_json(R"({"backend": "none"})");
  EXPECT_LE(rel_l2(fixture.run(WanTransformer::load(dir, per_block), StepInfo::at(1, 4)), dense), 1e-6);
  per_block.layer_configs.erase(1);
  EXPECT_GT(rel_l2(fixture.run(WanTransformer::load(dir, per_block), StepInfo::at(1, 4)), dense), 1e-4);
  per_block.layer_configs[2] = parse_sparse_attn_json(R"({"backend": "none"})");
  try {
    WanTransformer::load(dir, per_block);
    ADD_FAILURE() << "no Error for a config of block 2 in a 2-block model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer_configs"), std::string::npos) << e.what();
  }

  // A pattern with a geometry must be given this latent's patch grid (3 x 5 x 3).
  const WanConfig config = load_wan_config(dir);
  EXPECT_EQ(wan_spatial_layout(config, 3, 10, 6).num_tokens(), 45);
  WanAttentionOptions radial =
      attention_through(registry, R"({"backend": "radial", "pattern": {"type": "radial"}, "geometry": {"block_q": 8, "block_kv": 8}})");
  radial.config.geometry.spatial_layout = wan_spatial_layout(config, 3, 10, 6);
  EXPECT_TRUE(std::isfinite(rel_l2(fixture.run(WanTransformer::load(dir, radial), StepInfo::at(0, 1)), dense)));
  radial.config.geometry.spatial_layout = wan_spatial_layout(config, 3, 6, 10);
  try {
    fixture.run(WanTransformer::load(dir, radial), StepInfo::at(0, 1));
    ADD_FAILURE() << "no Error for a spatial layout of another grid";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 x 5 x 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("spatial_layout"), std::string::npos) << e.what();
  }
}

TEST(WanParity, BadInputsNameTheArgument) {
  const Fixture fixture;
  const WanTransformer model = WanTransformer::load(wan_fixture_dir() / "checkpoint");
  const Tensor& latents = fixture.io.at("hidden_states");
  const Tensor& timestep = fixture.io.at("timestep");
  const Tensor& text = fixture.io.at("encoder_hidden_states");
  Tensor out = Tensor::empty(latents.shape(), DType::kF32);
  const auto expect_error = [&](const TensorView& l, const TensorView& t, const TensorView& e, const TensorView& o,
                                const std::string& part) {
    try {
      model.forward(ExecContext{}, {}, l, t, e, o);
      ADD_FAILURE() << "no Error; expected one naming " << part;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(part), std::string::npos) << error.what();
    }
  };
  const Tensor odd_width = Tensor::zeros({2, 16, 3, 10, 5}, DType::kF32);
  expect_error(odd_width, timestep, text, Tensor::zeros({2, 16, 3, 10, 5}, DType::kF32), "latents width");
  expect_error(latents, Tensor::zeros({3}, DType::kF32), text, out, "timestep");
  expect_error(latents, Tensor::zeros({2, 44}, DType::kF32), text, out, "timestep (one per token, or one per latent frame)");
  expect_error(latents, timestep, Tensor::zeros({2, 7, 23}, DType::kF32), out, "text");
  expect_error(latents, timestep, text, Tensor::zeros({2, 16, 3, 10, 6}, DType::kF16), "out");
  const Tensor too_long = Tensor::zeros({1, 16, 33, 2, 2}, DType::kF32);
  expect_error(too_long, Tensor::zeros({1}, DType::kF32), Tensor::zeros({1, 7, 24}, DType::kF32), too_long,
               "rope_max_seq_len");
}

TEST(WanModel, WeightsAreCheckedAtConstruction) {
  const std::string dir = wan_fixture_dir() / "checkpoint";
  const WanConfig config = load_wan_config(dir);
  auto weights = load_weights(Checkpoint::open(dir), wan_weight_specs(config), DType::kF32);
  weights.erase("proj_out.bias");
  try {
    WanTransformer model(config, weights);
    ADD_FAILURE() << "no Error for a missing tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("proj_out.bias"), std::string::npos) << e.what();
  }
}

// FP8 self-attention (WanAttentionOptions::precision) runs on CUDA only: the CPU model refuses it
// before any weight is made, naming the field and the CLI flag, at every door (random, the
// weights' constructor, with_attention).
TEST(WanModel, Fp8AttentionIsRefusedOnTheCpu) {
  WanConfig config = load_wan_config(wan_fixture_dir() / "checkpoint");
  WanAttentionOptions fp8;
  fp8.precision = AttentionPrecision::kFp8;
  const auto expect_refusal = [](const char* door, const auto& call) {
    try {
      call();
      ADD_FAILURE() << door << ": no Error for fp8 attention on the CPU";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("WanAttentionOptions::precision"), std::string::npos) << door << ": " << message;
      EXPECT_NE(message.find("--attention-dtype"), std::string::npos) << door << ": " << message;
      EXPECT_NE(message.find("CUDA"), std::string::npos) << door << ": " << message;
    }
  };
  expect_refusal("random", [&] { WanTransformer::random(config, 7, fp8); });
  expect_refusal("constructor", [&] { WanTransformer(config, random_wan_weights(config, 7), fp8); });
  const WanTransformer bf16 = WanTransformer::random(config, 7);
  expect_refusal("with_attention", [&] { bf16.with_attention(fp8); });
}

TEST(WanModel, RandomWeightsGiveAFiniteOutput) {
  WanConfig config = load_wan_config(wan_fixture_dir() / "checkpoint");
  const WanTransformer model = WanTransformer::random(config, 7);
  const Fixture fixture;
  const Tensor out = fixture.run(model);
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isfinite(out.data_as<float>()[i])) << i;
}

}  // namespace
}  // namespace tessel
