// `tessel generate` end to end on a diffusers-layout model directory around the Wan fixture
// transformer: from the pipeline fixture's noise and embeddings it writes the latents diffusers'
// WanPipeline reached, and a bad directory, size or frame count is an error before any weight loads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "generate_cli_util.h"
#include "run_tessel.h"
#include "tessel/core/device.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/video_io.h"
#include "tessel/diffusion/wan_text_encoder.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

TEST(GenerateCli, WritesTheLatentsDiffusersReaches) {
  const fs::path dir = make_model_dir("wan_model");
  const fs::path out = dir / "latents.safetensors";
  const TesselRun run = generate("--model '" + dir.string() + "' --embeddings '" + kPipelineFixture + "' --noise '" +
                                 kPipelineFixture + "' --size 48x80 --frames 9 --steps 4 --guidance 5 --threads 1 --out '" +
                                 out.string() + "'");
  ASSERT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("step 4/4"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("eta"), std::string::npos) << run.out;
  const Tensor latents = SafetensorsFile::open(out.string()).load("latents");
  const Tensor expected = SafetensorsFile::open(kPipelineFixture).load("unipc_cfg.latents");  // (4, 1, 16, 3, 10, 6)
  const int64_t count = latents.numel();
  ASSERT_EQ(count * 4, expected.numel());
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const double want = expected.data_as<float>()[3 * count + i];
    diff += (latents.data_as<float>()[i] - want) * (latents.data_as<float>()[i] - want);
    norm += want * want;
  }
  EXPECT_LE(std::sqrt(diff / norm), 1e-5);
}

TEST(GenerateCli, BadModelDirectoriesAndSizesAreErrors) {
  const fs::path dir = make_model_dir("wan_model_errors");
  const std::string common = " --embeddings '" + kPipelineFixture + "' --out '" + (dir / "x.safetensors").string() + "'";
  const std::string model = "--model '" + dir.string() + "'";
  const std::pair<std::string, std::string> cases[] = {
      {model + " --size 50x80 --frames 9", "width"},
      {model + " --size 48x80 --frames 10", "frames"},
      {model + " --size 48by80 --frames 9", "--size"},
      {"--model '" + (dir / "missing").string() + "' --size 48x80 --frames 9", "model_index.json"},
      // A text-to-video transformer under an image-to-video pipeline class.
      {"--model '" + make_model_dir("i2v_model", "WanImageToVideoPipeline").string() + "' --size 48x80 --frames 9",
       "in_channels"},
  };
  for (const auto& [args, fragment] : cases) {
    const TesselRun run = generate(args + common);
    EXPECT_NE(run.status, 0) << args;
    EXPECT_NE(run.out.find(fragment), std::string::npos) << args << "\n" << run.out;
  }
  fs::remove_all(dir / "scheduler");
  const TesselRun run = generate(model + " --size 48x80 --frames 9" + common);
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.out.find("scheduler/"), std::string::npos) << run.out;
}

// A tiny random model from `tessel init-model`: --prompt runs tokenizer and text encoder and gives
// the same latents as --embeddings holding what the library's text encoder makes of the prompts.
TEST(GenerateCli, PromptGivesTheLatentsOfItsEmbeddings) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("tiny_wan_prompt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const TesselRun init = run_tessel_binary("init-model --preset tiny --out '" + dir.string() + "'", dir.string() + ".log");
  ASSERT_EQ(init.status, 0) << init.out;
  EXPECT_NE(init.out.find("RANDOM"), std::string::npos) << init.out;
  const std::string common = " --size 32x32 --frames 5 --steps 2 --guidance 4 --threads 1 --seed 3";
  const fs::path from_prompt = dir / "prompt.safetensors", from_embeddings = dir / "embeddings.safetensors";
  const TesselRun run = generate("--model '" + dir.string() + "' --prompt 'a cat  in the “neon” city' --negative-prompt 'blurry'" +
                                 common + " --out '" + from_prompt.string() + "'");
  ASSERT_EQ(run.status, 0) << run.out;

  const WanTextEncoder encoder = WanTextEncoder::load(dir.string());
  const Tensor both = encoder.encode(ExecContext{}, {"a cat  in the “neon” city", "blurry"});
  const int64_t length = both.size(1), width = both.size(2);
  const TensorView prompt(both.data_as<float>(), DType::kF32, Device::cpu(), {1, length, width});
  const TensorView negative(both.data_as<float>() + length * width, DType::kF32, Device::cpu(), {1, length, width});
  const fs::path embeddings = dir / "text.safetensors";
  write_safetensors(embeddings.string(), {{"prompt_embeds", prompt}, {"negative_prompt_embeds", negative}});
  const TesselRun reference = generate("--model '" + dir.string() + "' --embeddings '" + embeddings.string() + "'" + common +
                                       " --out '" + from_embeddings.string() + "'");
  ASSERT_EQ(reference.status, 0) << reference.out;

  const Tensor a = SafetensorsFile::open(from_prompt.string()).load("latents");
  const Tensor b = SafetensorsFile::open(from_embeddings.string()).load("latents");
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(std::memcmp(a.data_as<float>(), b.data_as<float>(), a.numel() * sizeof(float)), 0);
}

// --num-outputs N: N outputs with seeds seed .. seed + N - 1, denoised as one batch per step; each
// ends where its seed alone ends (within the fp32 rounding of another batch size), files -0, -1, ...
TEST(GenerateCli, NumOutputsDenoiseOneBatchOfSeeds) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("tiny_wan_outputs_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ASSERT_EQ(run_tessel_binary("init-model --preset tiny --out '" + dir.string() + "'", dir.string() + ".log").status, 0);
  const std::string common = "--model '" + dir.string() + "' --prompt 'a cat' --size 32x32 --frames 5 --steps 3 --guidance 4 --threads 1";
  const TesselRun batch = generate(common + " --seed 7 --num-outputs 3 --out '" + (dir / "many.safetensors").string() + "'");
  ASSERT_EQ(batch.status, 0) << batch.out;
  for (int i = 0; i < 3; ++i) {
    const fs::path alone = dir / ("alone" + std::to_string(i) + ".safetensors");
    const TesselRun run = generate(common + " --seed " + std::to_string(7 + i) + " --out '" + alone.string() + "'");
    ASSERT_EQ(run.status, 0) << run.out;
    const Tensor a = SafetensorsFile::open(alone.string()).load("latents");
    const Tensor b = SafetensorsFile::open((dir / ("many-" + std::to_string(i) + ".safetensors")).string()).load("latents");
    ASSERT_EQ(a.shape(), b.shape());
    double diff = 0.0, norm = 0.0;
    for (int64_t k = 0; k < a.numel(); ++k) {
      const double d = a.data_as<float>()[k] - b.data_as<float>()[k];
      diff += d * d;
      norm += static_cast<double>(a.data_as<float>()[k]) * a.data_as<float>()[k];
    }
    EXPECT_LE(std::sqrt(diff / norm), 1e-5) << "output " << i;
  }
  EXPECT_FALSE(fs::exists(dir / "many.safetensors"));
  const fs::path noise = dir / "noise.safetensors";
  const Tensor zeros = Tensor::zeros({1, 16, 2, 4, 4}, DType::kF32);
  write_safetensors(noise.string(), {{"noise", zeros.view()}});
  const TesselRun with_noise =
      generate(common + " --num-outputs 2 --noise '" + noise.string() + "' --out '" + (dir / "n.safetensors").string() + "'");
  EXPECT_NE(with_noise.status, 0);
  EXPECT_NE(with_noise.out.find("--num-outputs"), std::string::npos) << with_noise.out;
  EXPECT_NE(with_noise.out.find("--noise"), std::string::npos) << with_noise.out;
}

// The arguments of a 12-step generation of latents on a fresh `init-model` directory named `name`.
std::string cache_run_arguments(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  EXPECT_EQ(run_tessel_binary("init-model --out '" + dir.string() + "'", dir.string() + ".log").status, 0);
  return "--model '" + dir.string() + "' --prompt 'a cat' --size 32x32 --frames 5 --steps 12 --threads 1 --out '" +
         (dir / "latents.safetensors").string() + "'";
}

TEST(GenerateCli, TeaCacheReportsTheStepsItSkipped) {
  const std::string common = cache_run_arguments("tiny_wan_teacache");
  const TesselRun run = generate(common + " --cache teacache --teacache-thresh 0.2");
  ASSERT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("teacache: blocks skipped in "), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("of 12 steps (conditional branch, "), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("skipped in 0 of"), std::string::npos) << run.out;
  const TesselRun unknown = generate(common + " --cache dbcache2");
  EXPECT_NE(unknown.status, 0);
  EXPECT_NE(unknown.out.find("--cache"), std::string::npos) << unknown.out;
  const TesselRun negative = generate(common + " --cache teacache --teacache-thresh -1");
  EXPECT_NE(negative.status, 0);
  EXPECT_NE(negative.out.find("--teacache-thresh"), std::string::npos) << negative.out;
}

// The tiny preset has 2 layers: F1B0 leaves one block to skip; a threshold of 1 or more skips every
// step after the warm-up (cache-dit's "always similar").
TEST(GenerateCli, DBCacheReportsTheStepsAndBlocksItSkipped) {
  const std::string common = cache_run_arguments("tiny_wan_dbcache") + " --cache dbcache";
  const TesselRun run = generate(common + " --dbcache-fn 1 --dbcache-bn 0 --dbcache-thresh 2 --dbcache-warmup 4");
  ASSERT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("dbcache: blocks skipped in 8 of 12 steps (conditional branch, 8 of 24 blocks), "
                         "8 of 12 steps (unconditional branch, 8 of 24 blocks)"),
            std::string::npos)
      << run.out;
  const TesselRun limited = generate(common + " --dbcache-fn 1 --dbcache-thresh 2 --dbcache-warmup 4 --dbcache-max-consecutive 1");
  ASSERT_EQ(limited.status, 0) << limited.out;
  EXPECT_NE(limited.out.find("dbcache: blocks skipped in 4 of 12 steps"), std::string::npos) << limited.out;
  const TesselRun defaults = generate(common);  // cache-dit's F8B0 on a 2-layer transformer
  EXPECT_NE(defaults.status, 0);
  EXPECT_NE(defaults.out.find("dbcache_first_blocks + dbcache_last_blocks"), std::string::npos) << defaults.out;
  const TesselRun no_first = generate(common + " --dbcache-fn 0");
  EXPECT_NE(no_first.status, 0);
  EXPECT_NE(no_first.out.find("--dbcache-fn"), std::string::npos) << no_first.out;
  const TesselRun negative = generate(common + " --dbcache-fn 1 --dbcache-thresh -0.5");
  EXPECT_NE(negative.status, 0);
  EXPECT_NE(negative.out.find("--dbcache-thresh"), std::string::npos) << negative.out;
}

// Prompt to video on a fresh `init-model` directory: tokenizer, text encoder, transformer, scheduler,
// VAE, and an MP4 that libavformat reads back (or PNG frames that libpng reads back).
TEST(GenerateCli, PromptToMp4AndPngOnTheTinyModel) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("tiny_wan_video_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ASSERT_EQ(run_tessel_binary("init-model --out '" + dir.string() + "'", dir.string() + ".log").status, 0);
  const std::string common = "--model '" + dir.string() + "' --prompt 'a cat in the neon city' --size 48x32 --steps 3 --threads 1";
  if (mp4_available()) {
    const fs::path video = dir / "cat.mp4";
    const TesselRun run = generate(common + " --frames 9 --cache teacache --out '" + video.string() + "'");
    ASSERT_EQ(run.status, 0) << run.out;
    EXPECT_NE(run.out.find("9 frames of 48x32 at 16 fps"), std::string::npos) << run.out;
    const VideoFileInfo info = probe_video(video.string());
    EXPECT_EQ(info.frames, 9);
    EXPECT_EQ(info.width, 48);
    EXPECT_EQ(info.height, 32);
    EXPECT_NEAR(info.fps, 16.0, 1e-9);
  }
  const TesselRun run = generate(common + " --frames 1 --out '" + (dir / "cat.png").string() + "'");
  ASSERT_EQ(run.status, 0) << run.out;
  // Every phase is reported, in order (one line each when stderr is not a terminal).
  size_t at = 0;
  for (const char* phase : {"text encoding...", "denoising...", "denoising: step 3/3", "decoding...", "decoding: latent frame 1/1", "writing "}) {
    const size_t found = run.out.find(phase, at);
    EXPECT_NE(found, std::string::npos) << phase << "\n" << run.out;
    if (found != std::string::npos) at = found;
  }
  const VideoFrames image = read_png((dir / "cat.png").string());
  EXPECT_EQ(image.width, 48);
  EXPECT_EQ(image.height, 32);

  const TesselRun gif = generate(common + " --frames 1 --out '" + (dir / "cat.gif").string() + "'");
  EXPECT_NE(gif.status, 0);
  EXPECT_NE(gif.out.find("--out: expected a file ending in .mp4"), std::string::npos) << gif.out;
  fs::remove_all(dir / "vae");
  const TesselRun no_vae = generate(common + " --frames 1 --out '" + (dir / "cat.png").string() + "'");
  EXPECT_NE(no_vae.status, 0);
  EXPECT_NE(no_vae.out.find("vae/"), std::string::npos) << no_vae.out;
}

// --device / --dtype: the CPU computes fp32, CUDA bf16; a CUDA device in a build without CUDA or on a
// machine without a GPU is an error before any weight loads. --noise must have the latent shape.
TEST(GenerateCli, DeviceDtypeAndNoiseShapeErrors) {
  const fs::path dir = make_model_dir("wan_model_device_errors");
  const std::string common = "--model '" + dir.string() + "' --embeddings '" + kPipelineFixture +
                             "' --size 48x80 --frames 9 --steps 1 --threads 1 --out '" + (dir / "x.safetensors").string() + "'";
  const std::string no_cuda = cuda_compiled() ? "no CUDA GPU found" : "built without CUDA";
  std::vector<std::pair<std::string, std::string>> cases = {
      {" --device cpu --dtype bf16", "--dtype: expected fp32 on the CPU, got bf16"},
      {" --device cuda:x", "--device"},
      {" --dtype fp16", "--dtype"},
  };
  if (!cuda_available()) {
    cases.emplace_back(" --device cuda", no_cuda);
    cases.emplace_back(" --device cuda:1 --dtype bf16", no_cuda);
  } else {
    cases.emplace_back(" --device cuda --dtype fp32", "--dtype: expected bf16 on CUDA, got fp32");
    // CFG-parallel on CUDA needs two ranks (one GPU each): one process is refused before any weight loads.
    cases.emplace_back(" --device cuda --guidance 5 --cfg-parallel", "--cfg-parallel");
  }
  for (const auto& [args, fragment] : cases) {
    const TesselRun run = generate(common + args);
    EXPECT_NE(run.status, 0) << args;
    EXPECT_NE(run.out.find(fragment), std::string::npos) << args << "\n" << run.out;
  }
  // The fixture's noise is (1, 16, 3, 10, 6): 9 frames of 48 x 80 pixels; 13 frames want 4 latent frames.
  const TesselRun wrong = generate("--model '" + dir.string() + "' --embeddings '" + kPipelineFixture + "' --noise '" +
                                   kPipelineFixture + "' --size 48x80 --frames 13 --out '" + (dir / "y.safetensors").string() + "'");
  EXPECT_NE(wrong.status, 0);
  EXPECT_NE(wrong.out.find("--noise: expected a \"noise\" tensor of the latent shape (1, 16, 4, 10, 6)"), std::string::npos)
      << wrong.out;
  EXPECT_NE(wrong.out.find("(1, 16, 3, 10, 6)"), std::string::npos) << wrong.out;
  EXPECT_FALSE(fs::exists(dir / "y.safetensors"));
}

// The summary a benchmark parses: one JSON line with the per-step times.
TEST(GenerateCli, PrintsMachineReadableTimings) {
  const fs::path dir = make_model_dir("wan_model_timings");
  const TesselRun run = generate("--model '" + dir.string() + "' --embeddings '" + kPipelineFixture + "' --noise '" +
                                 kPipelineFixture + "' --size 48x80 --frames 9 --steps 3 --threads 1 --out '" +
                                 (dir / "x.safetensors").string() + "'");
  ASSERT_EQ(run.status, 0) << run.out;
  const size_t at = run.out.find("generate-timings ");
  ASSERT_NE(at, std::string::npos) << run.out;
  const size_t end = run.out.find('\n', at);
  const nlohmann::json report = nlohmann::json::parse(run.out.substr(at + 17, end - at - 17));
  EXPECT_EQ(report["device"], "cpu");
  EXPECT_EQ(report["steps"], 3);
  ASSERT_EQ(report["step_s"].size(), 3u);
  double sum = 0.0;
  for (const auto& s : report["step_s"]) {
    EXPECT_GT(s.get<double>(), 0.0);
    sum += s.get<double>();
  }
  EXPECT_NEAR(report["denoise_s"].get<double>(), sum, 1e-9);
  EXPECT_GE(report["scheduler_s"].get<double>(), 0.0);
  EXPECT_LT(report["scheduler_s"].get<double>(), sum);
  EXPECT_GE(report["total_s"].get<double>(), sum);
}

TEST(GenerateCli, BadTextArgumentsAreErrors) {
  const fs::path dir = make_model_dir("wan_model_text_errors");  // no tokenizer/ or text_encoder/
  const std::string common = " --size 48x80 --frames 9 --out '" + (dir / "x.safetensors").string() + "'";
  const std::string model = "--model '" + dir.string() + "'";
  const std::string embeddings = " --embeddings '" + kPipelineFixture + "'";
  const std::pair<std::string, std::string> cases[] = {
      {model + " --prompt 'a cat'" + embeddings, "exactly one of them, got both"},
      {model, "exactly one of them, got neither"},
      {model + embeddings + " --negative-prompt 'dark'", "--negative-prompt"},
      {model + " --prompt 'a cat'", "tokenizer/ (for --prompt)"},
  };
  for (const auto& [args, fragment] : cases) {
    const TesselRun run = generate(args + common);
    EXPECT_NE(run.status, 0) << args;
    EXPECT_NE(run.out.find(fragment), std::string::npos) << args << "\n" << run.out;
  }
  const fs::path tiny = dir / "tiny";
  ASSERT_EQ(run_tessel_binary("init-model --out '" + tiny.string() + "'", dir / "init.log").status, 0);
  const TesselRun run = generate("--model '" + tiny.string() + "' --prompt \"$(printf 'bad \\377 byte')\"" + common);
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.out.find("prompts[0]: expected UTF-8 text"), std::string::npos) << run.out;
}

// --lora merges an adapter at load (the merge itself is tested against diffusers in
// wan_lora_test): the run names the file, its format and modules, and its latents differ from the
// plain run's; a LoRA flag the model or the other flags cannot use is an error naming it.
TEST(GenerateCli, LoraFlagsMergeTheAdapterAndBadOnesAreErrors) {
  const fs::path dir = make_model_dir("wan_model_lora");
  const std::string common = "--model '" + dir.string() + "' --embeddings '" + kPipelineFixture + "' --noise '" + kPipelineFixture +
                             "' --size 48x80 --frames 9 --steps 2 --guidance 5 --threads 1 --out '";
  const std::string kohya = kFixtures + "/wan_lora/kohya.safetensors";
  ASSERT_EQ(generate(common + (dir / "plain.safetensors").string() + "'").status, 0);
  const TesselRun run = generate(common + (dir / "lora.safetensors").string() + "' --lora '" + kohya + ":0.75'");
  ASSERT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("lora: transformer: " + kohya + " (scale 0.75): kohya/musubi, low-rank, 26 modules"), std::string::npos)
      << run.out;
  const Tensor plain = SafetensorsFile::open((dir / "plain.safetensors").string()).load("latents");
  const Tensor merged = SafetensorsFile::open((dir / "lora.safetensors").string()).load("latents");
  ASSERT_EQ(plain.numel(), merged.numel());
  double diff = 0.0;
  for (int64_t i = 0; i < plain.numel(); ++i) diff += std::abs(plain.data_as<float>()[i] - merged.data_as<float>()[i]);
  EXPECT_GT(diff / static_cast<double>(plain.numel()), 1e-4);

  const auto error = [&](const std::string& flags, const std::string& expected) {
    const TesselRun bad = generate(common + (dir / "bad.safetensors").string() + "' " + flags);
    EXPECT_NE(bad.status, 0) << flags;
    EXPECT_NE(bad.out.find(expected), std::string::npos) << flags << ": " << bad.out;
    EXPECT_FALSE(fs::exists(dir / "bad.safetensors")) << flags;
  };
  error("--lora-2 '" + kohya + "'", "--lora-2");
  error("--lora-ignore-unmatched", "--lora-ignore-unmatched");
  error("--lora '" + kohya + ":nan'", "--lora");
  error("--lora '" + (dir / "absent.safetensors").string() + "'", "absent.safetensors");
  error("--lora '" + kPipelineFixture + "'", "no key matched");
}

}  // namespace
}  // namespace tessel
