// WanPipeline with a VAE: the loop's final latents come back decoded as 8-bit frames, exactly the
// VAE's decode of those latents; a cancelled run decodes nothing; a VAE that does not fit the
// transformer is refused when the pipeline is built.
#include <gtest/gtest.h>

#include <atomic>

#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/wan_pipeline.h"

namespace tessel {
namespace {

const std::string kFixtureDir = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures";

// Zero weights for `config`: enough to build a WanVae whose shapes are all that matters.
WanVae zero_vae(const WanVaeConfig& config) {
  std::map<std::string, Tensor> weights;
  for (const WeightSpec& spec : wan_vae_weight_specs(config)) weights[spec.name] = Tensor::zeros(spec.shape, DType::kF32);
  return WanVae(config, weights);
}

TEST(WanPipelineVae, GenerateReturnsTheDecodedFrames) {
  const WanTransformer transformer = WanTransformer::load(kFixtureDir + "/wan/checkpoint");
  const WanVae vae = WanVae::load(kFixtureDir + "/diffusion/vae");
  const SafetensorsFile fixture = SafetensorsFile::open(kFixtureDir + "/diffusion/wan_pipeline.safetensors");
  SchedulerConfig scheduler_config;
  scheduler_config.shift = 3.0;
  auto scheduler = make_scheduler(scheduler_config);
  const WanPipeline pipeline(transformer, *scheduler, &vae);
  WanGenerationOptions options;
  options.num_inference_steps = 2;
  options.guidance_scale = 1.0;
  options.size = WanVideoSize{9, 80, 48};
  const Tensor prompt = fixture.load("prompt_embeds"), noise = fixture.load("noise");
  const WanGenerationResult result = pipeline.generate(ExecContext{}, prompt, TensorView{}, options, noise);
  ASSERT_EQ(result.steps_done, 2);
  EXPECT_EQ(result.frames.count, 9);
  EXPECT_EQ(result.frames.height, 80);
  EXPECT_EQ(result.frames.width, 48);
  EXPECT_EQ(result.frames.rgb, video_frames_from_tensor(vae.decode(ExecContext{}, result.latents)).rgb);

  // Cancelled before the first step: latents only.
  std::atomic<bool> cancel{true};
  options.cancel = &cancel;
  const WanGenerationResult cancelled = pipeline.generate(ExecContext{}, prompt, TensorView{}, options, noise);
  EXPECT_TRUE(cancelled.cancelled);
  EXPECT_EQ(cancelled.frames.count, 0);
  EXPECT_TRUE(cancelled.frames.rgb.empty());

  // Without a VAE there is nothing to decode with.
  const WanPipeline latents_only(transformer, *scheduler);
  EXPECT_THROW(latents_only.decode(ExecContext{}, result.latents), Error);
}

TEST(WanPipelineVae, AVaeThatDoesNotFitTheTransformerIsRefused) {
  const WanTransformer transformer = WanTransformer::load(kFixtureDir + "/wan/checkpoint");
  auto scheduler = make_scheduler(SchedulerConfig{});
  const auto refusal = [&](const WanVae& vae) -> std::string {
    try {
      WanPipeline pipeline(transformer, *scheduler, &vae);
    } catch (const Error& e) {
      return e.what();
    }
    return "accepted";
  };
  WanVaeConfig config;
  config.base_dim = config.decoder_base_dim = 2;
  config.num_res_blocks = 1;
  config.z_dim = 8;
  config.latents_mean.assign(8, 0.0f);
  config.latents_std.assign(8, 1.0f);
  const std::string narrow = refusal(zero_vae(config));
  EXPECT_NE(narrow.find("VAE z_dim"), std::string::npos) << narrow;
  config = WanVaeConfig{};
  config.base_dim = config.decoder_base_dim = 2;
  config.num_res_blocks = 1;
  config.temporal_downsample = {false, false, true};  // 2 frames per latent, not 4
  const std::string slow = refusal(zero_vae(config));
  EXPECT_NE(slow.find("4 frames"), std::string::npos) << slow;
}

}  // namespace
}  // namespace tessel
