// Wan 2.2 TI2V-5B's text-to-video layout against diffusers (tests/fixtures/diffusion/wan22_ti2v/, written
// by scripts/make_ti2v_pipeline_fixture.py): WanPipeline with expand_timesteps (one timestep per token,
// all equal to t for text to video) on a tiny random transformer of 8 latent channels and the residual,
// patched VAE of tests/fixtures/diffusion/vae_residual/ (16 pixels per latent pixel). tessel runs the
// loop with the scalar timestep; the latents after each of 2 UniPC steps with guidance 5 and the decoded
// 8-bit frames must match diffusers'.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/wan_pipeline.h"
#include "diffusion/diffusion_test_util.h"

namespace tessel {
namespace {

const std::string kFixture = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/diffusion/wan22_ti2v";
const std::string kVae = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/diffusion/vae_residual";

TEST(WanTi2vPipeline, LatentsAndFramesMatchDiffusers) {
  const WanTransformer transformer = WanTransformer::load(kFixture + "/transformer");
  const WanVae vae = WanVae::load(kVae);
  auto scheduler = make_scheduler(load_scheduler_config(kFixture + "/scheduler"));
  const WanPipeline pipeline(transformer, *scheduler, &vae);
  const SafetensorsFile io = SafetensorsFile::open(kFixture + "/io.safetensors");
  const Tensor prompt = io.load("prompt_embeds"), negative = io.load("negative_prompt_embeds"), noise = io.load("noise");
  const Tensor expected_latents = io.load("latents"), expected_frames = io.load("frames");
  WanGenerationOptions options;
  options.num_inference_steps = 2;
  options.guidance_scale = 5.0;
  options.size = WanVideoSize{5, 32, 64, 16};
  std::vector<double> step_errors;
  const int64_t count = noise.numel();
  options.on_step = [&](const WanStepProgress& p) {
    step_errors.push_back(rel_l2(p.latents.data_as<const float>(),
                                 expected_latents.data_as<float>() + (p.step - 1) * count, count));
  };
  const WanGenerationResult result = pipeline.generate(ExecContext{}, prompt, negative, options, noise);
  ASSERT_EQ(result.steps_done, 2);
  ASSERT_EQ(step_errors.size(), 2u);
  for (size_t i = 0; i < step_errors.size(); ++i) {
    std::printf("TI2V step %zu latents rel-L2 vs diffusers: %.3g\n", i + 1, step_errors[i]);
    EXPECT_LE(step_errors[i], 1e-5) << "step " << i + 1;
  }

  ASSERT_EQ(expected_frames.shape(), (Shape{5, 32, 64, 3}));
  ASSERT_EQ(result.frames.count, 5);
  ASSERT_EQ(result.frames.height, 32);
  ASSERT_EQ(result.frames.width, 64);
  ASSERT_EQ(static_cast<int64_t>(result.frames.rgb.size()), expected_frames.numel());
  const double psnr = frames_psnr(result.frames, expected_frames);
  std::printf("TI2V frames PSNR vs diffusers: %.1f dB\n", psnr);
  EXPECT_GE(psnr, 60.0);
}

// The VAE's 16 pixels per latent pixel: a size in Wan 2.1's units is refused before the first step,
// and sizes are multiples of 32 (the VAE's 16 times the transformer's 2 x 2 patches).
TEST(WanTi2vPipeline, SizeMustUseTheVaeStride) {
  const WanTransformer transformer = WanTransformer::load(kFixture + "/transformer");
  const WanVae vae = WanVae::load(kVae);
  auto scheduler = make_scheduler(load_scheduler_config(kFixture + "/scheduler"));
  const WanPipeline pipeline(transformer, *scheduler, &vae);
  const Tensor prompt = SafetensorsFile::open(kFixture + "/io.safetensors").load("prompt_embeds");
  WanGenerationOptions options;
  options.num_inference_steps = 1;
  options.guidance_scale = 1.0;
  options.size = WanVideoSize{5, 32, 64};  // stride 8
  try {
    pipeline.generate(ExecContext{}, prompt, TensorView{}, options);
    FAIL() << "a stride-8 size was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vae_spatial_stride"), std::string::npos) << e.what();
  }
  const WanVideoSize odd{5, 48, 64, 16};
  try {
    odd.validate();
    FAIL() << "a height of 48 was accepted with stride 16";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a multiple of 32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel
