// One GPU: the Wan transformer's CUDA forward under parallel groups of one rank (the single-rank
// communicator, and NCCL when built with it) runs the sequence-parallel path — the shard of token
// rows taken from the patchified latent, the blocks on it, RoPE from the shard's first position,
// the self-attention through ParallelAttention, the output patches gathered over the sequence
// group — and equals the forward without groups bit for bit: one shard is the whole sequence, so
// the same kernels run on the same rows. Dense, a static mask (radial) and a mask estimated on the
// device (dynamic top-k, after a dense warm-up step); per-batch, per-frame and per-token timesteps
// (per frame: expanded per token before the shard is taken, so it equals the forward without
// groups given the expanded timesteps); text to
// video and Wan 2.1 I2V's layout (36 input channels, the image branch over 257 CLIP tokens: the
// image tokens are cross-attention keys, never sharded); two steps, so the sharding kept by the
// model is reused. Several GPUs (Ulysses, Ring, USP,
// CFG-parallel) run with `tessel dit-bench --check` (scripts/multi-gpu-check.sh); the same
// layouts on CPUs are wan_parallel_mpi_test's. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/core/exec_context.h"
#include "tessel/core/random.h"
#include "tessel/dit/wan_config.h"
#include "tessel/dit/wan_model.h"
#include "tessel/parallel/communicator.h"
#include "tessel/parallel/parallel_config.h"
#include "tessel/sparse/builtin_backends.h"
#include "tessel/sparse/config.h"
#include "tessel/sparse/registry.h"

namespace tessel {
namespace {

// Wan 1.3B's blocks (12 heads of 128), two of them; a 3 x 16 x 15 patch grid (720 tokens: several
// 128-token query blocks, an odd width).
constexpr int64_t kBatch = 2, kFrames = 3, kHeight = 32, kWidth = 30, kTextTokens = 7;

WanConfig two_block_config() {
  WanConfig c = wan_preset("wan-1.3b");
  c.num_layers = 2;
  return c;
}

// The same blocks with Wan 2.1 I2V's inputs: ViT-H/14's 257 tokens of width 1280.
constexpr int64_t kImageTokens = 257;
WanConfig two_block_i2v_config() {
  WanConfig c = two_block_config();
  c.in_channels = 2 * c.out_channels + 4;
  c.image_dim = 1280;
  c.added_kv_proj_dim = c.inner_dim();
  return c;
}

struct Inputs {
  Tensor latents, timestep, text, image;  // on the GPU; image undefined without an image branch
  // The same timesteps one per token (each frame's repeated over its tokens): what the sharded
  // forward runs on, so the forward without groups on them computes the same rows.
  Tensor token_timestep;
};

// timesteps_per_entry: 1, kFrames (one per latent frame) or the tokens (one per token).
Inputs random_inputs(const WanConfig& c, int64_t timesteps_per_entry, uint64_t seed) {
  Tensor latents = Tensor::empty({kBatch, c.in_channels, kFrames, kHeight, kWidth}, DType::kF32);
  Tensor text = Tensor::empty({kBatch, kTextTokens, c.text_dim}, DType::kF32);
  Tensor timestep = timesteps_per_entry > 1 ? Tensor::empty({kBatch, timesteps_per_entry}, DType::kF32) : Tensor::empty({kBatch}, DType::kF32);
  fill_normal(latents.view(), seed);
  fill_normal(text.view(), seed + 1);
  fill_uniform(timestep.view(), seed + 2, 0.0, 1000.0);  // distinct per entry (and per token)
  const Device gpu = Device::cuda(0);
  Tensor image;
  if (c.has_image_branch()) {
    image = Tensor::empty({kBatch, kImageTokens, c.image_dim}, DType::kF32);
    fill_normal(image.view(), seed + 3);
    image = image.to(gpu);
  }
  const int64_t seq = kFrames * (kHeight / c.patch_size[1]) * (kWidth / c.patch_size[2]);
  Tensor token_timestep = timestep;
  if (timesteps_per_entry > 1 && timesteps_per_entry < seq) {
    token_timestep = Tensor::empty({kBatch, seq}, DType::kF32);
    for (int64_t i = 0; i < kBatch * seq; ++i)
      token_timestep.data_as<float>()[i] = timestep.data_as<float>()[i / (seq / timesteps_per_entry)];
  }
  return {latents.to(gpu), timestep.to(gpu), text.to(gpu), image, token_timestep.to(gpu)};
}

Tensor forward(const ExecContext& ctx, const WanTransformer& model, const Inputs& in, const StepInfo& step) {
  // Poisoned (filled on the host, then moved): every element must be written.
  Shape shape = in.latents.shape();
  shape[1] = model.config().out_channels;
  Tensor poison = Tensor::empty(shape, DType::kF32);
  fill(poison.view(), 12345.0);
  Tensor out = poison.to(in.latents.device());
  if (in.image.defined())
    model.forward(ctx, step, in.latents, in.timestep, in.text, in.image, out);
  else
    model.forward(ctx, step, in.latents, in.timestep, in.text, out);
  return out.to(Device::cpu());
}

struct AttentionCase {
  std::string name;
  WanAttentionOptions options;
};

std::vector<AttentionCase> attention_cases(const WanConfig& c, BackendRegistry& registry) {
  std::vector<AttentionCase> cases{{"dense", {}}};
  WanAttentionOptions radial;
  radial.registry = &registry;
  radial.config = parse_sparse_attn_json(R"({"backend": "radial", "pattern": {"type": "radial"}})");
  radial.config.geometry.spatial_layout = wan_spatial_layout(c, kFrames, kHeight, kWidth);
  cases.push_back({"radial", radial});
  // Ranking every block (random tokens are not self-similar); dense at step 0.
  WanAttentionOptions topk;
  topk.registry = &registry;
  topk.config = parse_sparse_attn_json(R"({"backend": "dynamic_topk", "pattern": {"type": "dynamic_topk"},
      "selection": {"topk_ratio": 0.3}, "options": {"similarity_threshold": "-2"}, "warmup": {"dense_steps": 1}})");
  cases.push_back({"dynamic_topk", topk});
  return cases;
}

TEST(WanParallelGpu, OneRankGroupsRunTheShardedForwardAndEqualTheForwardWithoutGroups) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped";
  const Device gpu = Device::cuda(0);
  ExecContext ctx;
  ctx.device = gpu;
  const std::unique_ptr<Communicator> bootstrap = make_single_rank_communicator(Device::cpu());
  std::vector<std::unique_ptr<Communicator>> worlds;
  worlds.push_back(make_single_rank_communicator(gpu));
  if (nccl_compiled()) worlds.push_back(make_nccl_communicator(ctx, *bootstrap, gpu));
  BackendRegistry registry(false);
  register_builtin_backends(registry);
  for (const WanConfig& config : {two_block_config(), two_block_i2v_config()}) {
    const WanTransformer weights = WanTransformer::random(config, 7, {}, gpu);
    const int64_t seq = kFrames * (kHeight / config.patch_size[1]) * (kWidth / config.patch_size[2]);
    for (const int64_t timesteps_per_entry : {int64_t{1}, kFrames, seq}) {
      const Inputs in = random_inputs(config, timesteps_per_entry, 11 + timesteps_per_entry);
      for (const AttentionCase& attention : attention_cases(config, registry)) {
        const WanTransformer plain = weights.with_attention(attention.options);
        for (const auto& world : worlds) {
          SCOPED_TRACE(attention.name + " on " + world->engine() + detail::concat(", ", timesteps_per_entry, " timesteps per entry") +
                       (config.has_image_branch() ? ", image branch" : ""));
          const ParallelGroups groups = initialize_parallel_groups(*world, ParallelConfig{});
          WanAttentionOptions sharded_options = attention.options;
          sharded_options.parallel = &groups;
          const WanTransformer sharded = weights.with_attention(sharded_options);
          Inputs per_token = in;
          per_token.timestep = in.token_timestep;
          for (const int64_t step : {0, 1}) {
            const Tensor expected = forward(ctx, plain, per_token, StepInfo::at(step, 4));
            const Tensor actual = forward(ctx, sharded, in, StepInfo::at(step, 4));
            ASSERT_EQ(actual.nbytes(), expected.nbytes());
            EXPECT_EQ(std::memcmp(actual.data(), expected.data(), expected.nbytes()), 0) << "step " << step;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessel
