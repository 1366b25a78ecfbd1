// `tessel generate --image` end to end on the diffusers image-to-video fixture
// (tests/fixtures/diffusion/wan21_i2v/, scripts/make_i2v_pipeline_fixture.py): from its noise,
// embeddings and image (written here as a PNG) it writes the latents diffusers'
// WanImageToVideoPipeline reached; every wrong combination of images and model is an
// error naming the flag before any weight loads. `init-model --preset tiny-i2v / tiny-flf2v /
// tiny-i2v-a14b` write directories that an image and a prompt turn into frames of the requested size.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "diffusion/diffusion_test_util.h"
#include "generate_cli_util.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/video_io.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

const std::string kI2v = kFixtures + "/diffusion/wan21_i2v/i2v";
const std::string kFlf2v = kFixtures + "/diffusion/wan21_i2v/flf2v";

// The fixture's image (H, W, 3) as a PNG under the test's temp dir.
std::string fixture_png(const std::string& model, const std::string& name) {
  const VideoFrames image = frames_of_image(SafetensorsFile::open(model + "/io.safetensors").load(name));
  const std::string path = (fs::path(::testing::TempDir()) / (name + "_" + std::to_string(::getpid()) + ".png")).string();
  write_png(path, image);
  return path;
}

std::string common(const std::string& model) {
  return "--model '" + model + "' --embeddings '" + model + "/io.safetensors' --noise '" + model +
         "/io.safetensors' --size 48x32 --frames 5 --steps 2 --guidance 5 --threads 1";
}

TEST(GenerateI2vCli, WritesTheLatentsDiffusersReaches) {
  for (const std::string& model : {kI2v, kFlf2v}) {
    const std::string out = (fs::path(::testing::TempDir()) / ("i2v_latents_" + std::to_string(::getpid()) + ".safetensors")).string();
    std::string images = " --image '" + fixture_png(model, "image") + "'";
    if (model == kFlf2v) images += " --last-image '" + fixture_png(model, "last_image") + "'";
    const TesselRun run = generate(common(model) + images + " --out '" + out + "'");
    ASSERT_EQ(run.status, 0) << run.out;
    EXPECT_NE(run.out.find("image encoding"), std::string::npos) << run.out;
    const Tensor latents = SafetensorsFile::open(out).load("latents");
    const Tensor expected = SafetensorsFile::open(model + "/io.safetensors").load("latents");  // (2, 1, 16, 2, 4, 6)
    const int64_t count = latents.numel();
    ASSERT_EQ(2 * count, expected.numel());
    double diff = 0.0, norm = 0.0;
    for (int64_t i = 0; i < count; ++i) {
      const double want = expected.data_as<float>()[count + i];
      diff += (latents.data_as<float>()[i] - want) * (latents.data_as<float>()[i] - want);
      norm += want * want;
    }
    EXPECT_LE(std::sqrt(diff / norm), 1e-5) << model;
  }
}

TEST(GenerateI2vCli, ImageFlagsAreCheckedAgainstTheModel) {
  const std::string image = fixture_png(kI2v, "image");
  const std::string out = " --out '" + (fs::path(::testing::TempDir()) / "never.png").string() + "'";
  const fs::path corrupt = fs::path(::testing::TempDir()) / ("corrupt_" + std::to_string(::getpid()) + ".png");
  std::ofstream(corrupt) << "\x89PNG\r\n\x1a\n not really";
  const fs::path t2v = make_model_dir("t2v_for_image");
  const std::pair<std::string, std::string> cases[] = {
      {common(kI2v), "--image"},                                                       // an i2v model without an image
      {common(kI2v) + " --image '" + image + "' --last-image '" + image + "'", "--last-image"},  // one-image branch
      {common(kFlf2v) + " --image '" + image + "'", "--last-image"},                   // FLF2V without its last image
      {common(kI2v) + " --image '" + corrupt.string() + "'", "--image"},
      {common(kI2v) + " --image ''", "--image"},
      {"--model '" + t2v.string() + "' --embeddings '" + kPipelineFixture + "' --size 48x80 --frames 9 --image '" + image + "'",
       "--image"},
      {"--model '" + t2v.string() + "' --embeddings '" + kPipelineFixture + "' --size 48x80 --frames 9 --last-image '" + image + "'",
       "--last-image"},
  };
  for (const auto& [args, flag] : cases) {
    const TesselRun run = generate(args + out);
    EXPECT_NE(run.status, 0) << args;
    EXPECT_NE(run.out.find(flag), std::string::npos) << args << "\n" << run.out;
    EXPECT_EQ(run.out.find("step 1/"), std::string::npos) << "a step ran: " << args;
  }
}

// A 56 x 40 gradient (another aspect than the video's: the image is resized and CLIP crops it).
std::string gradient_png(const std::string& name, int shift) {
  VideoFrames image;
  image.count = 1;
  image.height = 40;
  image.width = 56;
  image.rgb.resize(static_cast<size_t>(image.height * image.width * 3));
  for (size_t i = 0; i < image.rgb.size(); ++i) image.rgb[i] = static_cast<uint8_t>((i * 7 + static_cast<size_t>(shift)) % 256);
  const std::string path = (fs::path(::testing::TempDir()) / (name + "_" + std::to_string(::getpid()) + ".png")).string();
  write_png(path, image);
  return path;
}

TEST(GenerateI2vCli, ImageAndPromptToPngFramesOnTheTinyImageToVideoPresets) {
  const std::string image = gradient_png("i2v_first", 0), last = gradient_png("i2v_last", 101);
  for (const std::string preset : {"tiny-i2v", "tiny-flf2v", "tiny-i2v-a14b"}) {
    const fs::path dir = fs::path(::testing::TempDir()) / (preset + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    const TesselRun init = run_tessel_binary("init-model --preset " + preset + " --out '" + dir.string() + "'", dir.string() + ".log");
    ASSERT_EQ(init.status, 0) << init.out;
    EXPECT_NE(init.out.find("image-to-video"), std::string::npos) << init.out;
    std::string images = " --image '" + image + "'";
    if (preset == "tiny-flf2v") images += " --last-image '" + last + "'";
    const TesselRun run = generate("--model '" + dir.string() + "'" + images + " --prompt 'a cat' --size 64x64 --frames 5 "
                                   "--steps 2 --threads 1 --out '" + (dir / "cat.png").string() + "'");
    ASSERT_EQ(run.status, 0) << preset << "\n" << run.out;
    if (preset == "tiny-i2v-a14b")  // two experts, no CLIP
      EXPECT_NE(run.out.find("1 on transformer_2"), std::string::npos) << run.out;
    else
      EXPECT_NE(run.out.find("image encoding"), std::string::npos) << run.out;
    for (const char* frame : {"cat_00000.png", "cat_00004.png"}) {
      const VideoFrames frames = read_png((dir / frame).string());
      EXPECT_EQ(frames.width, 64) << preset << " " << frame;
      EXPECT_EQ(frames.height, 64) << preset << " " << frame;
    }
    EXPECT_FALSE(fs::exists(dir / "cat_00005.png")) << preset;
  }
}

}  // namespace
}  // namespace tessel
