// Wan 2.2 TI2V-5B's image-to-video half against diffusers (tests/fixtures/diffusion/wan22_ti2v/
// io_i2v.safetensors, written by scripts/make_ti2v_pipeline_fixture.py): WanImageToVideoPipeline with
// expand_timesteps on the tiny TI2V transformer and residual VAE. The image (24 x 56, resized to the
// 32 x 64 video with Lanczos) through the VAE's encoder is the first latent frame, whose tokens get
// timestep 0; the latents after each of 2 UniPC steps (the loop's own, before the first frame is put
// back) and the decoded frames (after) must match diffusers'.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "diffusion/diffusion_test_util.h"
#include "error_of.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/wan_generator.h"
#include "tessel/diffusion/wan_image_condition.h"

namespace tessel {
namespace {

using testing::error_of;

const std::string kFixture = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/diffusion/wan22_ti2v";
const std::string kVae = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/diffusion/vae_residual";

TEST(WanTi2vImageToVideo, FirstFrameLatentsAndFramesMatchDiffusers) {
  const WanTransformer transformer = WanTransformer::load(kFixture + "/transformer");
  const WanVae vae = WanVae::load(kVae);
  const SafetensorsFile io = SafetensorsFile::open(kFixture + "/io_i2v.safetensors");
  const Tensor pixels = io.load("image");

  // The first frame: the image's normalized latents.
  const Tensor first = wan_image_pixels(frames_of_image(pixels), 32, 64, "image");
  const Tensor latents = wan_first_frame_latents(ExecContext{}, vae, first);
  const Tensor expected_first = io.load("first_frame");
  ASSERT_EQ(latents.shape(), expected_first.shape());
  const double first_error = rel_l2(latents.data_as<float>(), expected_first.data_as<float>(), expected_first.numel());
  std::printf("TI2V i2v first frame rel-L2 vs diffusers: %.3g\n", first_error);
  EXPECT_LE(first_error, 1e-5);

  // The loop with it.
  auto scheduler = make_scheduler(load_scheduler_config(kFixture + "/scheduler"));
  const WanPipeline pipeline(transformer, *scheduler, &vae);
  WanGenerationOptions options;
  options.num_inference_steps = 2;
  options.guidance_scale = 5.0;
  options.size = WanVideoSize{5, 32, 64, 16};
  options.first_frame = latents;
  const Tensor noise = io.load("noise"), expected = io.load("latents"), expected_frames = io.load("frames");
  const int64_t count = noise.numel();
  std::vector<double> errors;
  options.on_step = [&](const WanStepProgress& p) {
    errors.push_back(rel_l2(p.latents.data_as<const float>(), expected.data_as<float>() + (p.step - 1) * count, count));
  };
  const WanGenerationResult result =
      pipeline.generate(ExecContext{}, io.load("prompt_embeds"), io.load("negative_prompt_embeds"), options, noise);
  ASSERT_EQ(errors.size(), 2u);
  for (size_t i = 0; i < errors.size(); ++i) {
    std::printf("TI2V i2v step %zu latents rel-L2 vs diffusers: %.3g\n", i + 1, errors[i]);
    EXPECT_LE(errors[i], 1e-5) << "step " << i + 1;
  }
  ASSERT_EQ(result.frames.count, 5);
  const double psnr = frames_psnr(result.frames, expected_frames);
  std::printf("TI2V i2v frames PSNR vs diffusers: %.1f dB\n", psnr);
  EXPECT_GE(psnr, 60.0);
}

TEST(WanTi2vImageToVideo, AFirstFrameIsCheckedAgainstThePipeline) {
  const WanTransformer transformer = WanTransformer::load(kFixture + "/transformer");
  const WanVae vae = WanVae::load(kVae);
  auto scheduler = make_scheduler(load_scheduler_config(kFixture + "/scheduler"));
  const WanPipeline pipeline(transformer, *scheduler, &vae);
  const SafetensorsFile io = SafetensorsFile::open(kFixture + "/io_i2v.safetensors");
  WanGenerationOptions options;
  options.num_inference_steps = 1;
  options.guidance_scale = 1.0;
  options.size = WanVideoSize{5, 32, 64, 16};
  options.first_frame = Tensor::zeros({1, 8, 2, 2, 4}, DType::kF32);  // two frames
  EXPECT_NE(error_of([&] { pipeline.generate(ExecContext{}, io.load("prompt_embeds"), TensorView{}, options); }).find("first_frame"),
            std::string::npos);
  options.first_frame = io.load("first_frame").clone();
  options.first_frame.data_as<float>()[3] = NAN;
  EXPECT_NE(error_of([&] { pipeline.generate(ExecContext{}, io.load("prompt_embeds"), TensorView{}, options); }).find("first_frame"),
            std::string::npos);
}

}  // namespace
}  // namespace tessel
