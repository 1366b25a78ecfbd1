// Per-request LoRA through the generation door (WanLoadOptions::lora_adapters, WanRequest::lora) on
// the tiny random model: a request naming an adapter gives what the same request gives from a
// generator with that adapter merged at load; requests with two different adapters and one without
// stepped together (one batched forward per step, the batch carrying each row's adapter) each give
// their result alone; and unknown names, diffs and two-expert models are refused naming the field.
//
// Tolerance: fp32 on the CPU. Merged versus unmerged are the same sums in another order, and a
// batch versus alone another GEMM blocking (rel-L2 about 4e-7 per forward, wan_pipeline.h); over
// three steps both stay below 1e-5, while each adapter moves the latents by more than 1e-2.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "diffusion/diffusion_test_util.h"
#include "error_of.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/wan_generator.h"
#include "tessel/dit/wan_weights.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

struct TempModel {
  fs::path dir;
  explicit TempModel(const std::string& preset) {
    dir = fs::path(::testing::TempDir()) / ("generator_lora_" + preset + "_" + std::to_string(getpid()));
    fs::remove_all(dir);
    write_random_wan_model(dir.string(), preset, 23, 1);
  }
  ~TempModel() { fs::remove_all(dir); }
};

// A rank-`rank` adapter with random factors on a few linear layers of `config`'s transformer (the
// conditioning, attention, FFN and output), in PEFT's names; `seed` makes each adapter its own.
std::string write_adapter(const fs::path& path, const WanConfig& config, int64_t rank, uint64_t seed) {
  std::map<std::string, Shape> shapes;
  for (const WeightSpec& spec : wan_weight_specs(config)) shapes.emplace(spec.name, spec.shape);
  std::map<std::string, Tensor> tensors;
  for (const std::string module : {"condition_embedder.time_embedder.linear_2", "blocks.0.attn1.to_q", "blocks.0.attn2.to_v",
                                   "blocks.0.ffn.net.0.proj", "blocks.0.ffn.net.2", "proj_out"}) {
    const Shape& w = shapes.at(module + ".weight");
    Tensor down = Tensor::empty({rank, shape_numel(w) / w[0]}, DType::kF32), up = Tensor::empty({w[0], rank}, DType::kF32);
    fill_uniform(down.view(), ++seed, -0.4, 0.4);
    fill_uniform(up.view(), ++seed, -0.4, 0.4);
    tensors.emplace("transformer." + module + ".lora_A.weight", std::move(down));
    tensors.emplace("transformer." + module + ".lora_B.weight", std::move(up));
  }
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [name, tensor] : tensors) views.emplace_back(name, tensor.view());
  write_safetensors(path.string(), views);
  return path.string();
}

WanRequest request(uint64_t seed, const std::string& lora) {
  WanRequest r;
  r.prompt = "a red cube";
  r.frames = 5;
  r.height = 32;
  r.width = 32;
  r.steps = 3;
  r.seed = seed;
  r.lora = lora;
  return r;
}

double rel_l2_of(const Tensor& a, const Tensor& b) { return rel_l2(a.data_as<const float>(), b.data_as<const float>(), a.numel()); }

TEST(WanGeneratorLora, PerRequestAdaptersEqualMergedAndBatchTogether) {
  const TempModel model("tiny");
  const WanConfig config = WanModelDir::open(model.dir.string()).transformer;
  const std::string style = write_adapter(model.dir / "style.safetensors", config, 4, 100);
  const std::string other = write_adapter(model.dir / "other.safetensors", config, 3, 200);
  WanLoadOptions options;
  options.load_vae = false;
  options.lora_adapters = {{"style", {style, 0.8}}, {"other", {other, 1.0}}};
  WanGenerator generator = WanGenerator::load(ExecContext{}, model.dir.string(), options);
  const std::vector<WanRequest> requests = {request(5, "style"), request(6, "other"), request(7, "")};
  std::vector<Tensor> alone;
  for (const WanRequest& r : requests) alone.push_back(generator.generate(ExecContext{}, r).generation.latents);

  // Merged at load: the same request without a name.
  WanLoadOptions merged_options;
  merged_options.load_vae = false;
  merged_options.loras = {{style, 0.8}};
  WanGenerator merged = WanGenerator::load(ExecContext{}, model.dir.string(), merged_options);
  const Tensor merged_style = merged.generate(ExecContext{}, request(5, "")).generation.latents;
  EXPECT_LT(rel_l2_of(alone[0], merged_style), 1e-5);
  WanGenerator plain = WanGenerator::load(ExecContext{}, model.dir.string(), WanLoadOptions{.load_vae = false});
  EXPECT_GT(rel_l2_of(alone[0], plain.generate(ExecContext{}, request(5, "")).generation.latents), 1e-2) << "the adapter matters";
  EXPECT_LT(rel_l2_of(alone[2], plain.generate(ExecContext{}, request(7, "")).generation.latents), 1e-6) << "no adapter, no change";
  WanRequest other_as_style = request(6, "style");
  EXPECT_GT(rel_l2_of(alone[1], generator.generate(ExecContext{}, other_as_style).generation.latents), 1e-2) << "the adapters differ";

  // All three in flight: each step is one forward of the three (batched: one shape, no cache).
  std::vector<std::unique_ptr<WanGenerationState>> states;
  std::vector<WanGenerationState*> pointers;
  for (const WanRequest& r : requests) {
    states.push_back(generator.begin(ExecContext{}, r));
    pointers.push_back(states.back().get());
  }
  while (!states[0]->done()) generator.step(ExecContext{}, pointers);
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_LT(rel_l2_of(generator.finish(ExecContext{}, *states[i]).generation.latents, alone[i]), 1e-5) << "request " << i;
}

TEST(WanGeneratorLora, BadAdaptersAndNamesAreErrorsNamingTheField) {
  const TempModel model("tiny");
  const WanConfig config = WanModelDir::open(model.dir.string()).transformer;
  const std::string style = write_adapter(model.dir / "style.safetensors", config, 4, 100);
  WanLoadOptions options;
  options.load_vae = false;
  options.lora_adapters = {{"style", {style, 1.0}}};
  WanGenerator generator = WanGenerator::load(ExecContext{}, model.dir.string(), options);
  std::string message = error_of([&] { generator.begin(ExecContext{}, request(1, "nope")); });
  EXPECT_EQ(message.rfind("lora", 0), 0u) << message;
  EXPECT_NE(message.find("\"style\""), std::string::npos) << message;
  WanGenerator plain = WanGenerator::load(ExecContext{}, model.dir.string(), WanLoadOptions{.load_vae = false});
  EXPECT_EQ(error_of([&] { plain.begin(ExecContext{}, request(1, "style")); }).rfind("lora", 0), 0u);

  const TempModel two_experts("tiny-a14b");
  WanLoadOptions on_two = options;
  on_two.lora_adapters = {{"style", {write_adapter(two_experts.dir / "style.safetensors", WanModelDir::open(two_experts.dir.string()).transformer, 4, 1), 1.0}}};
  message = error_of([&] { WanGenerator::load(ExecContext{}, two_experts.dir.string(), on_two); });
  EXPECT_NE(message.find("lora_adapters"), std::string::npos) << message;

  // A full diff runs merged only.
  std::map<std::string, Shape> shapes;
  for (const WeightSpec& spec : wan_weight_specs(config)) shapes.emplace(spec.name, spec.shape);
  Tensor diff = Tensor::zeros(shapes.at("proj_out.weight"), DType::kF32);
  write_safetensors((model.dir / "diff.safetensors").string(), {{"diffusion_model.head.head.diff", diff.view()}});
  WanLoadOptions with_diff = options;
  with_diff.lora_adapters = {{"fast", {(model.dir / "diff.safetensors").string(), 1.0}}};
  message = error_of([&] { WanGenerator::load(ExecContext{}, model.dir.string(), with_diff); });
  EXPECT_NE(message.find("diff.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("head.head.diff"), std::string::npos) << message;
}

}  // namespace
}  // namespace tessel
