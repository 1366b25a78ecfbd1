// Image to video against diffusers' WanImageToVideoPipeline (tests/fixtures/diffusion/wan21_i2v/,
// written by scripts/make_i2v_pipeline_fixture.py): Wan 2.1 I2V's layout (CLIP features into the
// transformer's image branch, the frame mask and the encoded conditioning video on 20 channels after
// the latents) and FLF2V's (a last image: both images' CLIP tokens, the last frame in the mask and
// the conditioning video), on tiny random components, 2 UniPC steps with guidance 5, images of other
// sizes than the video's (the Lanczos resize and CLIP's resize and crop run). Each part is compared
// on its own (the CLIP features, the condition), then the generator's latents after each step and
// its decoded frames.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "diffusion/diffusion_test_util.h"
#include "error_of.h"
#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/clip_image_processor.h"
#include "tessel/diffusion/clip_vision_encoder.h"
#include "tessel/diffusion/wan_generator.h"
#include "tessel/diffusion/wan_image_condition.h"

namespace tessel {
namespace {

using testing::error_of;

const std::string kFixture = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/diffusion/wan21_i2v/";

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

class WanI2vPipeline : public ::testing::TestWithParam<const char*> {
 protected:
  std::string dir() const { return kFixture + GetParam(); }
  // FLF2V and Wan 2.2 I2V-A14B take a last image too.
  bool flf2v() const { return std::string(GetParam()) != "i2v"; }
};
// The generator over every layout, Wan 2.2 I2V-A14B's (two experts, no CLIP) included.
class WanI2vGeneratorLayouts : public WanI2vPipeline {};

TEST_P(WanI2vPipeline, ClipFeaturesAndConditionMatchDiffusers) {
  const SafetensorsFile io = SafetensorsFile::open(dir() + "/io.safetensors");
  const ClipImageProcessing processing =
      parse_clip_image_processing(read_text(dir() + "/image_processor/preprocessor_config.json"), "preprocessor_config.json");
  const ClipVisionEncoder clip = ClipVisionEncoder::load(dir() + "/image_encoder");
  const VideoFrames image = frames_of_image(io.load("image"));
  const Tensor expected_embeds = io.load("image_embeds");
  Tensor pixels = clip_preprocess(image, processing);
  if (flf2v()) {
    const Tensor last = clip_preprocess(frames_of_image(io.load("last_image")), processing);
    Tensor both = Tensor::empty({2, pixels.size(1), pixels.size(2), pixels.size(3)}, DType::kF32);
    std::memcpy(both.data(), pixels.data(), pixels.nbytes());
    std::memcpy(static_cast<char*>(both.data()) + pixels.nbytes(), last.data(), last.nbytes());
    pixels = both;
  }
  Tensor features = Tensor::empty({pixels.size(0), clip.config().tokens(), clip.config().hidden_size}, DType::kF32);
  clip.forward(ExecContext{}, pixels, features);
  const double clip_error = rel_l2(features.data_as<float>(), expected_embeds.data_as<float>(), expected_embeds.numel());
  std::printf("%s CLIP features rel-L2 vs diffusers: %.3g\n", GetParam(), clip_error);
  EXPECT_LE(clip_error, 1e-5);

  const WanVae vae = WanVae::load(dir() + "/vae");
  const Tensor first = wan_image_pixels(image, 32, 48, "image");
  const Tensor last = flf2v() ? wan_image_pixels(frames_of_image(io.load("last_image")), 32, 48, "last_image") : Tensor{};
  const Tensor condition = wan_image_condition(ExecContext{}, vae, first, last, 5);
  const Tensor expected = io.load("condition");
  ASSERT_EQ(condition.shape(), expected.shape());
  // The mask's 4 channels exactly; the encoded video within the VAE encoder's fp32 error.
  const int64_t mask_count = 4 * expected.size(2) * expected.size(3) * expected.size(4);
  EXPECT_EQ(std::memcmp(condition.data(), expected.data(), static_cast<size_t>(mask_count) * sizeof(float)), 0);
  const double latent_error = rel_l2(condition.data_as<float>() + mask_count, expected.data_as<float>() + mask_count,
                                     expected.numel() - mask_count);
  std::printf("%s condition latents rel-L2 vs diffusers: %.3g\n", GetParam(), latent_error);
  EXPECT_LE(latent_error, 1e-4);
}

TEST_P(WanI2vGeneratorLayouts, GeneratorLatentsAndFramesMatchDiffusers) {
  const SafetensorsFile io = SafetensorsFile::open(dir() + "/io.safetensors");
  WanLoadOptions options;
  options.load_text_encoder = false;
  WanGenerator generator = WanGenerator::load(ExecContext{}, dir(), options);
  EXPECT_EQ(generator.model().task, WanTask::kImageToVideo);
  EXPECT_EQ(generator.model().two_experts, std::string(GetParam()) == "a14b");
  WanRequest request;
  request.prompt_embeds = io.load("prompt_embeds");
  request.negative_prompt_embeds = io.load("negative_prompt_embeds");
  request.noise = io.load("noise");
  request.image = frames_of_image(io.load("image"));
  if (flf2v()) request.last_image = frames_of_image(io.load("last_image"));
  request.frames = 5;
  request.height = 32;
  request.width = 48;
  request.steps = 2;
  request.guidance = 5.0;
  const Tensor expected = io.load("latents");
  const int64_t count = request.noise.numel();
  std::vector<double> errors;
  request.on_step = [&](const WanStepProgress& p) {
    errors.push_back(rel_l2(p.latents.data_as<const float>(), expected.data_as<float>() + (p.step - 1) * count, count));
  };
  const WanGeneratorResult result = generator.generate(ExecContext{}, request);
  ASSERT_EQ(errors.size(), 2u);
  for (size_t i = 0; i < errors.size(); ++i) {
    std::printf("%s step %zu latents rel-L2 vs diffusers: %.3g\n", GetParam(), i + 1, errors[i]);
    EXPECT_LE(errors[i], 1e-5) << "step " << i + 1;
  }
  // Wan 2.2 I2V-A14B: t = 999 on the high-noise expert, 833 (below 0.9 x 1000) on the low-noise one.
  if (generator.model().two_experts) EXPECT_EQ(result.generation.experts, (std::vector<int>{0, 1}));
  const Tensor frames = io.load("frames");
  ASSERT_EQ(result.generation.frames.count, 5);
  ASSERT_EQ(static_cast<int64_t>(result.generation.frames.rgb.size()), frames.numel());
  const double psnr = frames_psnr(result.generation.frames, frames);
  std::printf("%s frames PSNR vs diffusers: %.1f dB\n", GetParam(), psnr);
  EXPECT_GE(psnr, 50.0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, WanI2vPipeline, ::testing::Values("i2v", "flf2v"));
INSTANTIATE_TEST_SUITE_P(Layouts, WanI2vGeneratorLayouts, ::testing::Values("i2v", "flf2v", "a14b"));

TEST(WanI2vGenerator, ImagesAreCheckedAgainstTheModel) {
  const std::string i2v = kFixture + "i2v", flf2v = kFixture + "flf2v";
  const SafetensorsFile io = SafetensorsFile::open(i2v + "/io.safetensors");
  WanLoadOptions options;
  options.load_text_encoder = false;
  WanGenerator generator = WanGenerator::load(ExecContext{}, i2v, options);
  WanRequest request;
  request.prompt_embeds = io.load("prompt_embeds");
  request.negative_prompt_embeds = io.load("negative_prompt_embeds");
  request.frames = 5;
  request.height = 32;
  request.width = 48;
  request.steps = 1;
  // No image for an image-to-video model; a last image for a one-image branch.
  EXPECT_NE(error_of([&] { generator.begin(ExecContext{}, request); }).find("image"), std::string::npos);
  request.image = frames_of_image(io.load("image"));
  request.last_image = request.image;
  EXPECT_NE(error_of([&] { generator.begin(ExecContext{}, request); }).find("last_image"), std::string::npos);
  // Two frames where one is expected, and a malformed frame.
  request.last_image = {};
  VideoFrames two = request.image;
  two.count = 2;
  two.rgb.insert(two.rgb.end(), request.image.rgb.begin(), request.image.rgb.end());
  request.image = two;
  EXPECT_NE(error_of([&] { generator.begin(ExecContext{}, request); }).find("image"), std::string::npos);
  request.image = frames_of_image(io.load("image"));
  request.image.rgb.pop_back();
  EXPECT_NE(error_of([&] { generator.begin(ExecContext{}, request); }).find("image"), std::string::npos);
  // FLF2V needs its last image.
  WanGenerator flf2v_generator = WanGenerator::load(ExecContext{}, flf2v, options);
  request.image = frames_of_image(io.load("image"));
  EXPECT_NE(error_of([&] { flf2v_generator.begin(ExecContext{}, request); }).find("last_image"), std::string::npos);
}

}  // namespace
}  // namespace tessel
