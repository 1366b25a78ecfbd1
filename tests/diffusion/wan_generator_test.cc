// The generation door on the tiny random models: generate equals begin / step / finish, states
// interleave without changing each other's result, the model directory is read and checked once
// (errors name the file and field), and every source of non-finite values is refused naming it:
// embeddings, noise, a weight at load (transformer, VAE), a prediction that overflows. (A decoded
// video is checked too, but the VAE clamps to [-1, 1], so only a NaN there would be refused, and
// random weights give no way to make one that is not already refused at load.)
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "diffusion/diffusion_test_util.h"
#include "error_of.h"
#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/wan_generator.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

std::string model_of(const std::string& preset, const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("generator_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  write_random_wan_model(dir.string(), preset, 17, 1);
  return dir.string();
}

WanRequest small_request() {
  WanRequest r;
  r.prompt = "a red cube";
  r.frames = 5;
  r.height = 32;
  r.width = 32;
  r.steps = 3;
  r.seed = 9;
  return r;
}

using testing::error_of;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// rel-L2 of fp32 a against b (the same shape).
double rel_l2_of(const Tensor& a, const Tensor& b) { return rel_l2(a.data_as<const float>(), b.data_as<const float>(), a.numel()); }

TEST(WanGenerator, GenerateEqualsBeginStepFinishAndStatesInterleave) {
  const std::string dir = model_of("tiny-a14b", "steps");
  WanLoadOptions options;
  options.load_vae = false;
  WanGenerator generator = WanGenerator::load(ExecContext{}, dir, options);
  EXPECT_TRUE(generator.model().two_experts);
  EXPECT_EQ(generator.model().task, WanTask::kTextToVideo);
  WanRequest a = small_request(), b = small_request();
  b.seed = 10;
  b.steps = 5;
  b.guidance_2 = 2.0;
  const Tensor whole_a = generator.generate(ExecContext{}, a).generation.latents;
  const Tensor whole_b = generator.generate(ExecContext{}, b).generation.latents;
  EXPECT_FALSE(same_bits(whole_a, whole_b));
  // Two requests in flight, stepped together until both are done: each gets its own result. They
  // share a forward while both run on one expert (step-level batching), so within the fp32
  // rounding of another batch size (a mixed-up row would be off by far more).
  auto state_a = generator.begin(ExecContext{}, a);
  auto state_b = generator.begin(ExecContext{}, b);
  WanGenerationState* const both[] = {state_a.get(), state_b.get()};
  int rounds = 0;
  while (!state_a->done() || !state_b->done()) {
    generator.step(ExecContext{}, both);
    ++rounds;
  }
  EXPECT_EQ(rounds, 5);
  EXPECT_EQ(state_a->steps_done(), 3);
  const WanGeneratorResult result_a = generator.finish(ExecContext{}, *state_a);
  const WanGeneratorResult result_b = generator.finish(ExecContext{}, *state_b);
  ASSERT_EQ(result_a.generation.latents.shape(), whole_a.shape());
  ASSERT_EQ(result_b.generation.latents.shape(), whole_b.shape());
  EXPECT_LE(rel_l2_of(result_a.generation.latents, whole_a), 1e-5);
  EXPECT_LE(rel_l2_of(result_b.generation.latents, whole_b), 1e-5);
  EXPECT_GT(rel_l2_of(whole_a, whole_b), 1e-2);
  EXPECT_EQ(result_b.generation.experts.size(), 5u);
  EXPECT_NE(error_of([&] { generator.finish(ExecContext{}, *state_a); }).find("finished"), std::string::npos);
  fs::remove_all(dir);
}

// Progress: the phases in order, every step, every latent frame of the decode; and a cancel seen
// during the decode stops it there (no frames, the result says cancelled).
TEST(WanGenerator, ReportsPhasesStepsAndDecodeChunksAndCancelsDuringTheDecode) {
  const std::string dir = model_of("tiny", "progress");
  WanGenerator generator = WanGenerator::load(ExecContext{}, dir, WanLoadOptions{});
  WanRequest r = small_request();  // 5 frames: 2 latent frames to decode
  std::vector<std::string> events;
  r.on_phase = [&](std::string_view phase) { events.emplace_back(phase); };
  r.on_step = [&](const WanStepProgress& p) { events.push_back(detail::concat("step ", p.step, "/", p.total_steps)); };
  r.on_decode_chunk = [&](int64_t done, int64_t chunks) { events.push_back(detail::concat("chunk ", done, "/", chunks)); };
  const WanGeneratorResult whole = generator.generate(ExecContext{}, r);
  const std::vector<std::string> expected = {"text encoding", "denoising", "step 1/3", "step 2/3", "step 3/3",
                                             "decoding", "chunk 1/2", "chunk 2/2"};
  EXPECT_EQ(events, expected);
  EXPECT_EQ(whole.generation.frames.count, 5);
  EXPECT_FALSE(whole.generation.cancelled);

  // decode = false (output_type="latent"): the same latents, no decode phase, no frames.
  events.clear();
  r.decode = false;
  const WanGeneratorResult latents_only = generator.generate(ExecContext{}, r);
  EXPECT_EQ(events, std::vector<std::string>(expected.begin(), expected.begin() + 5));
  EXPECT_EQ(latents_only.generation.frames.count, 0);
  ASSERT_EQ(latents_only.generation.latents.numel(), whole.generation.latents.numel());
  EXPECT_EQ(std::memcmp(latents_only.generation.latents.data(), whole.generation.latents.data(), whole.generation.latents.nbytes()), 0);
  r.decode = true;

  std::atomic<bool> cancel{false};
  r.cancel = &cancel;
  int chunks_seen = 0;
  r.on_phase = nullptr;
  r.on_step = nullptr;
  r.on_decode_chunk = [&](int64_t, int64_t) {
    ++chunks_seen;
    cancel = true;  // after the first latent frame
  };
  const WanGeneratorResult stopped = generator.generate(ExecContext{}, r);
  EXPECT_EQ(chunks_seen, 1);
  EXPECT_TRUE(stopped.generation.cancelled);
  EXPECT_EQ(stopped.generation.frames.count, 0);
  EXPECT_EQ(stopped.generation.steps_done, 3);
  fs::remove_all(dir);
}

TEST(WanGenerator, RequestsAndDirectoriesAreCheckedNamingTheField) {
  const std::string dir = model_of("tiny", "checks");
  WanGenerator generator = WanGenerator::load(ExecContext{}, dir, WanLoadOptions{});
  const std::pair<std::function<void(WanRequest&)>, std::string> cases[] = {
      {[](WanRequest& r) { r.width = 40; }, "width"},
      {[](WanRequest& r) { r.frames = 6; }, "frames"},
      {[](WanRequest& r) { r.steps = 0; }, "steps"},
      {[](WanRequest& r) { r.guidance = std::nan(""); }, "guidance"},
      {[](WanRequest& r) { r.guidance_2 = 2.0; }, "guidance_2"},
      {[](WanRequest& r) { r.prompt.clear(); }, "prompt"},
      {[](WanRequest& r) { r.cache = "teacache"; }, "cache"},
      {[](WanRequest& r) { r.sparse_setting = "fast"; }, "sparse_setting"},
      {[](WanRequest& r) { r.noise = Tensor::empty({1, 2, 3}, DType::kF32); }, "noise"},
      {[](WanRequest& r) {  // no text tokens at all
         r.prompt.clear();
         r.prompt_embeds = Tensor::empty({1, 0, 32}, DType::kF32);
         r.negative_prompt_embeds = Tensor::empty({1, 0, 32}, DType::kF32);
       },
       "prompt_embeds"},
  };
  for (const auto& [change, field] : cases) {
    WanRequest r = small_request();
    change(r);
    const std::string message = error_of([&] { generator.begin(ExecContext{}, r); });
    EXPECT_EQ(message.rfind(field, 0), 0u) << field << ": " << message;
  }
  EXPECT_NE(error_of([] { WanModelDir::open("/nonexistent/model"); }).find("model_index.json"), std::string::npos);
  std::ofstream(fs::path(dir) / "model_index.json") << R"({"_class_name": "WanPipeline", "boundary_ratio": 0.9})";
  EXPECT_NE(error_of([&] { WanModelDir::open(dir); }).find("transformer_2 and boundary_ratio"), std::string::npos);
  // A text-to-video transformer under the image-to-video class: its channels are named.
  std::ofstream(fs::path(dir) / "model_index.json") << R"({"_class_name": "WanImageToVideoPipeline"})";
  const std::string channels = error_of([&] { WanModelDir::open(dir); });
  EXPECT_NE(channels.find("in_channels"), std::string::npos) << channels;
  fs::remove_all(dir);
}

TEST(WanGenerator, NonFiniteInputsAndWeightsAreRefusedNamingTheSource) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  {
    const std::string dir = model_of("tiny", "nonfinite_inputs");
    WanGenerator generator = WanGenerator::load(ExecContext{}, dir, WanLoadOptions{});
    const int64_t text_dim = generator.model().transformer.text_dim;
    WanRequest r = small_request();
    r.prompt.clear();
    r.prompt_embeds = Tensor::empty({1, 8, text_dim}, DType::kF32);
    r.negative_prompt_embeds = Tensor::empty({1, 8, text_dim}, DType::kF32);
    std::fill_n(r.prompt_embeds.data_as<float>(), r.prompt_embeds.numel(), 0.5f);
    std::fill_n(r.negative_prompt_embeds.data_as<float>(), r.negative_prompt_embeds.numel(), 0.25f);
    r.prompt_embeds.data_as<float>()[7] = nan;
    EXPECT_EQ(error_of([&] { generator.begin(ExecContext{}, r); }).rfind("prompt_embeds: expected finite values", 0), 0u);
    r.prompt_embeds.data_as<float>()[7] = 0.5f;
    r.negative_prompt_embeds.data_as<float>()[3] = inf;
    EXPECT_EQ(error_of([&] { generator.begin(ExecContext{}, r); }).rfind("negative_prompt_embeds", 0), 0u);
    r.negative_prompt_embeds.data_as<float>()[3] = 0.25f;
    const WanVideoSize size = generator.size_of(r);
    r.noise = Tensor::empty(size.latent_shape(generator.model().transformer.in_channels), DType::kF32);
    std::fill_n(r.noise.data_as<float>(), r.noise.numel(), 0.0f);
    r.noise.data_as<float>()[11] = -inf;
    EXPECT_EQ(error_of([&] { generator.begin(ExecContext{}, r); }).rfind("noise", 0), 0u);
    fs::remove_all(dir);
  }
  {  // A NaN weight: refused at load, naming the file and the tensor (transformer, VAE, text encoder).
    const std::string dir = model_of("tiny", "nonfinite_weights");
    const std::pair<std::string, std::string> poisoned[] = {
        {"transformer/diffusion_pytorch_model.safetensors", "proj_out.weight"},
        {"vae/diffusion_pytorch_model.safetensors", "decoder.conv_out.weight"},
    };
    for (const auto& [file, tensor] : poisoned) {
      const std::string path = (fs::path(dir) / file).string();
      const std::string backup = path + ".bak";
      fs::copy_file(path, backup, fs::copy_options::overwrite_existing);
      rewrite_tensor(path, tensor, [&](float* data, int64_t) { data[1] = nan; });
      const std::string message = error_of([&] { WanGenerator::load(ExecContext{}, dir, WanLoadOptions{}); });
      EXPECT_NE(message.find(tensor), std::string::npos) << message;
      EXPECT_NE(message.find("expected finite values"), std::string::npos) << message;
      fs::rename(backup, path);
    }
    fs::remove_all(dir);
  }
  {  // Finite weights whose arithmetic overflows: the prediction is refused, naming the expert and step.
    const std::string dir = model_of("tiny", "overflow");
    const std::string transformer = (fs::path(dir) / "transformer/diffusion_pytorch_model.safetensors").string();
    const std::string backup = transformer + ".bak";
    fs::copy_file(transformer, backup);
    rewrite_tensor(transformer, "proj_out.weight", [](float* data, int64_t n) { std::fill_n(data, n, 3e38f); });
    {
      WanGenerator generator = WanGenerator::load(ExecContext{}, dir, WanLoadOptions{});
      const std::string message = error_of([&] { generator.generate(ExecContext{}, small_request()); });
      EXPECT_EQ(message.rfind("the guided noise prediction of transformer at step 1 of 3", 0), 0u) << message;
    }
    fs::rename(backup, transformer);
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace tessel
