// The non-finite policy of the generation door on a CUDA device (the CPU half is
// wan_generator_test.cc): a NaN weight is refused when the CUDA transformer or the VAE loads, naming
// the tensor; finite weights whose bf16 arithmetic overflows are refused at the first guided
// prediction, naming the expert and step (the device-side check of every step), not returned as a
// black video; non-finite embeddings are refused at begin. And the door itself on CUDA: generate
// equals begin / step / finish bit for bit. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <unistd.h>

#include "diffusion/diffusion_test_util.h"
#include "error_of.h"
#include "tessel/core/device.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/wan_generator.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

std::string model_of(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("generator_cuda_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  write_random_wan_model(dir.string(), "tiny-cuda", 23, 1);
  return dir.string();
}

WanLoadOptions cuda_options() {
  WanLoadOptions options;
  options.device = Device::cuda(0);
  options.load_text_encoder = false;  // the requests bring embeddings: the test is about the transformer and VAE
  return options;
}

// A request with constant embeddings of the model's text width.
WanRequest embeddings_request(int64_t text_dim) {
  WanRequest r;
  r.frames = 5;
  r.height = 32;
  r.width = 32;
  r.steps = 3;
  r.seed = 4;
  r.prompt_embeds = Tensor::empty({1, 8, text_dim}, DType::kF32);
  r.negative_prompt_embeds = Tensor::empty({1, 8, text_dim}, DType::kF32);
  std::fill_n(r.prompt_embeds.data_as<float>(), r.prompt_embeds.numel(), 0.5f);
  std::fill_n(r.negative_prompt_embeds.data_as<float>(), r.negative_prompt_embeds.numel(), 0.25f);
  return r;
}

TEST(WanGeneratorCuda, GenerateEqualsBeginStepFinish) {
  SKIP_WITHOUT_GPU();
  const std::string dir = model_of("steps");
  WanGenerator generator = WanGenerator::load(ExecContext{}, dir, cuda_options());
  const WanRequest r = embeddings_request(generator.model().transformer.text_dim);
  const WanGeneratorResult whole = generator.generate(ExecContext{}, r);
  auto state = generator.begin(ExecContext{}, r);
  WanGenerationState* const one[] = {state.get()};
  while (!state->done()) generator.step(ExecContext{}, one);
  const WanGeneratorResult stepped = generator.finish(ExecContext{}, *state);
  const Tensor& a = whole.generation.latents;
  const Tensor& b = stepped.generation.latents;
  ASSERT_GT(a.numel(), 0);
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  fs::remove_all(dir);
}

// Offloaded blocks through the whole door (the checkpoint's tensors written to pinned host memory
// at load): the latents equal the in-memory model's bit for bit, also when a step cache skips
// blocks (the skipped blocks are never copied; the next forward finds its first blocks again).
TEST(WanGeneratorCuda, OffloadedBlocksGiveTheSameLatentsWithAndWithoutAStepCache) {
  SKIP_WITHOUT_GPU();
  const std::string dir = model_of("offload");
  for (const std::string cache : {"none", "dbcache"}) {
    SCOPED_TRACE(cache);
    WanLoadOptions options = cuda_options();
    options.cache = cache;
    options.cache_config.dbcache_first_blocks = 1;  // the tiny model's second block is the skippable middle
    options.cache_config.dbcache_warmup_steps = 1;
    options.cache_config.dbcache_thresh = 100.0;  // every step after the warm-up skips it
    Tensor latents[2];
    int64_t skipped[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      options.residency = i == 0 ? WanWeightResidency::kDevice : WanWeightResidency::kOffloadBlocks;
      WanGenerator generator = WanGenerator::load(ExecContext{}, dir, options);
      WanRequest r = embeddings_request(generator.model().transformer.text_dim);
      r.steps = 4;
      r.decode = false;
      const WanGeneratorResult result = generator.generate(ExecContext{}, r);
      latents[i] = result.generation.latents;
      skipped[i] = result.generation.cache_stats.blocks_skipped[0];
    }
    ASSERT_GT(latents[0].numel(), 0);
    ASSERT_EQ(latents[0].shape(), latents[1].shape());
    EXPECT_EQ(std::memcmp(latents[0].data(), latents[1].data(), latents[0].nbytes()), 0);
    EXPECT_EQ(skipped[0], skipped[1]);
    if (cache == "dbcache") EXPECT_GT(skipped[1], 0) << "the cache skipped no block: the test would not cover skips";
  }
  WanLoadOptions cpu;
  cpu.residency = WanWeightResidency::kOffloadBlocks;
  cpu.load_text_encoder = false;
  const std::string message = error_of([&] { WanGenerator::load(ExecContext{}, dir, cpu); });
  EXPECT_NE(message.find("block offload"), std::string::npos) << message;
  fs::remove_all(dir);
}

TEST(WanGeneratorCuda, NonFiniteWeightsEmbeddingsAndPredictionsAreRefusedNamingTheSource) {
  SKIP_WITHOUT_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::string dir = model_of("nonfinite");
  {  // Embeddings: refused at begin, before any step.
    WanGenerator generator = WanGenerator::load(ExecContext{}, dir, cuda_options());
    WanRequest r = embeddings_request(generator.model().transformer.text_dim);
    r.prompt_embeds.data_as<float>()[5] = nan;
    EXPECT_EQ(error_of([&] { generator.begin(ExecContext{}, r); }).rfind("prompt_embeds: expected finite values", 0), 0u);
  }
  const std::pair<std::string, std::string> poisoned[] = {
      {"transformer/diffusion_pytorch_model.safetensors", "proj_out.weight"},
      {"transformer/diffusion_pytorch_model.safetensors", "blocks.1.ffn.net.2.weight"},
      {"vae/diffusion_pytorch_model.safetensors", "decoder.conv_out.weight"},
  };
  for (const auto& [file, tensor] : poisoned) {  // a NaN weight: refused as the CUDA device loads it
    const std::string path = (fs::path(dir) / file).string();
    const std::string backup = path + ".bak";
    fs::copy_file(path, backup, fs::copy_options::overwrite_existing);
    rewrite_tensor(path, tensor, [&](float* data, int64_t) { data[1] = nan; });
    const std::string message = error_of([&] { WanGenerator::load(ExecContext{}, dir, cuda_options()); });
    EXPECT_NE(message.find(tensor), std::string::npos) << message;
    EXPECT_NE(message.find("expected finite values"), std::string::npos) << message;
    fs::rename(backup, path);
  }
  {  // Finite bf16 weights whose products overflow: the first guided prediction is refused.
    const std::string transformer = (fs::path(dir) / "transformer/diffusion_pytorch_model.safetensors").string();
    const std::string backup = transformer + ".bak";
    fs::copy_file(transformer, backup, fs::copy_options::overwrite_existing);
    rewrite_tensor(transformer, "proj_out.weight", [](float* data, int64_t n) { std::fill_n(data, n, 3e38f); });
    WanGenerator generator = WanGenerator::load(ExecContext{}, dir, cuda_options());
    const std::string message =
        error_of([&] { generator.generate(ExecContext{}, embeddings_request(generator.model().transformer.text_dim)); });
    EXPECT_EQ(message.rfind("the guided noise prediction of transformer at step 1 of 3", 0), 0u) << message;
    fs::rename(backup, transformer);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessel
