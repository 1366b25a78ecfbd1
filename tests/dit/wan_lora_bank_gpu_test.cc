// Per-request (unmerged) LoRA on the bf16 CUDA transformer (tessel/dit/wan_lora_bank.h,
// src/dit/cuda/wan_lora_gemm.cc), on random tiny configs with odd patch grids: text-to-video
// with one timestep per entry and one per token (the time embedder's rows are then tokens), and
// Wan 2.1 I2V's image branch. Two adapters written by the test: "wide" of rank 8 on every linear
// layer (PEFT names, so the patch embedding's Conv3d, the fp32 conditioning linears, the GELU-tanh
// layers whose activation then runs after the sum, and the fp32 output projection all take it) and
// "narrow" of rank 5 (its intermediate's rows are 10 bytes: cuBLASLt runs less aligned algorithms)
// on a few (kohya names, alpha 10).
//
// Yardstick: E = the plain CUDA forward's distance from the CPU fp32 forward of the same weights
// (bf16 weights and GEMM operands; a few 1e-3 here, wan_cuda_gpu_test). The unmerged update adds
// bf16 rounding of its factors and of the rank-wide intermediate to a part of the output that is a
// fraction of it, so:
//   - CUDA per-request vs the CPU fp32 per-request forward: within 2 E;
//   - CUDA per-request vs the CUDA forward of the weights merged with the adapter (rounded to bf16
//     after merging): within 2 E;
//   - an entry of a batch mixing both adapters and none vs that entry run alone on CUDA: within E
//     (the same arithmetic but for the GEMM algorithms cuBLASLt picks for other row counts, and for
//     the entry without adapter, the GELU-tanh run apart from the epilogue when the batch has one).
// Each adapter moves the CPU output by more than 10x the bound, so an adapter on the wrong rows,
// at the wrong scale or missing from a layer fails. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "dit_test_util.h"
#include "tessel/core/device.h"
#include "tessel/core/exec_context.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/random.h"
#include "tessel/dit/wan_lora.h"
#include "tessel/dit/wan_lora_bank.h"
#include "tessel/dit/wan_model.h"
#include "tessel/dit/wan_weights.h"

namespace tessel {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

struct Case {
  std::string name;
  WanConfig config;
  int64_t frames = 3, height = 10, width = 6, text_len = 7, image_len = 0;
  bool per_token_timesteps = false;
};

std::vector<Case> cases() {
  WanConfig t2v;
  t2v.num_attention_heads = 2;
  t2v.attention_head_dim = 64;
  t2v.ffn_dim = 256;
  t2v.text_dim = 48;
  t2v.freq_dim = 32;
  t2v.num_layers = 2;
  t2v.rope_max_seq_len = 64;
  WanConfig i2v = t2v;
  i2v.in_channels = 2 * i2v.out_channels + 4;
  i2v.image_dim = 40;
  i2v.added_kv_proj_dim = i2v.inner_dim();
  return {{"t2v_grid3x5x3", t2v}, {"t2v_per_token_timesteps", t2v, 3, 10, 6, 7, 0, true}, {"i2v_9_image_tokens", i2v, 3, 10, 6, 7, 9}};
}

struct Inputs {
  Tensor latents, timestep, text, image;
};

// `batch` entries with distinct inputs and timesteps (per token: the first frame at 0).
Inputs make_inputs(const Case& c, int64_t batch, uint64_t seed) {
  Inputs in;
  in.latents = Tensor::empty({batch, c.config.in_channels, c.frames, c.height, c.width}, DType::kF32);
  in.text = Tensor::empty({batch, c.text_len, c.config.text_dim}, DType::kF32);
  fill_normal(in.latents.view(), seed + 1);
  fill_normal(in.text.view(), seed + 2);
  if (c.image_len > 0) {
    in.image = Tensor::empty({batch, c.image_len, c.config.image_dim}, DType::kF32);
    fill_normal(in.image.view(), seed + 3);
  }
  const int64_t seq = c.frames * (c.height / 2) * (c.width / 2), per_entry = c.per_token_timesteps ? seq : 1;
  in.timestep = per_entry > 1 ? Tensor::empty({batch, per_entry}, DType::kF32) : Tensor::empty({batch}, DType::kF32);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < per_entry; ++i)
      in.timestep.data_as<float>()[b * per_entry + i] = per_entry > 1 && i < seq / c.frames ? 0.0f : 999.0f - 180.0f * static_cast<float>(b);
  return in;
}

// Entry `b` of a batched tensor as a batch of one (undefined stays undefined).
Tensor entry(const Tensor& batched, int64_t b) {
  if (!batched.defined()) return {};
  Shape shape = batched.shape();
  const int64_t per_entry = batched.numel() / shape[0];
  shape[0] = 1;
  Tensor result = Tensor::empty(shape, DType::kF32);
  std::copy_n(batched.data_as<float>() + b * per_entry, per_entry, result.data_as<float>());
  return result;
}
Inputs entry(const Inputs& in, int64_t b) { return {entry(in.latents, b), entry(in.timestep, b), entry(in.text, b), entry(in.image, b)}; }

// The forward on the model's device into a NaN-poisoned output, returned on the host.
Tensor run(const WanTransformer& model, const Inputs& in, const WanLoraSelection* lora = nullptr) {
  const Device device = model.device();
  Shape shape = in.latents.shape();
  shape[1] = model.config().out_channels;
  Tensor poison = Tensor::empty(shape, DType::kF32);
  fill(poison.view(), std::nan(""));
  Tensor out = poison.to(device);
  ExecContext ctx;
  ctx.num_threads = 1;
  ctx.device = device;
  const Tensor latents = in.latents.to(device), timestep = in.timestep.to(device), text = in.text.to(device);
  if (in.image.defined())
    model.forward(ctx, {}, latents, timestep, text, in.image.to(device), out, nullptr, nullptr, lora);
  else
    model.forward(ctx, {}, latents, timestep, text, out, nullptr, nullptr, lora);
  return out.to(Device::cpu());
}

void write(const std::string& path, const std::map<std::string, Tensor>& tensors) {
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [name, tensor] : tensors) views.emplace_back(name, tensor.view());
  write_safetensors(path, views);
}

// The two adapters' files for `config` in `dir`: (name, file) as the bank takes them.
std::vector<std::pair<std::string, LoraFile>> write_adapters(const WanConfig& config, const std::filesystem::path& dir) {
  std::map<std::string, Tensor> wide, narrow;
  uint64_t seed = 900;
  const auto factor = [&](const Shape& shape, double scale) {
    Tensor t = Tensor::empty(shape, DType::kF32);
    fill_uniform(t.view(), ++seed, -scale, scale);
    return t;
  };
  for (const WeightSpec& spec : wan_weight_specs(config)) {
    const std::string suffix = ".weight";
    if (spec.shape.size() < 2 || spec.name.size() <= suffix.size() || spec.name.compare(spec.name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string module = spec.name.substr(0, spec.name.size() - suffix.size());
    const int64_t out = spec.shape[0], in = shape_numel(spec.shape) / out;
    wide.emplace("transformer." + module + ".lora_A.weight", factor({8, in}, 0.12));
    wide.emplace("transformer." + module + ".lora_B.weight", factor({out, 8}, 0.12));
    if (module == "blocks.0.attn1.to_v" || module == "blocks.1.attn2.to_q" || module == "blocks.0.ffn.net.0.proj" ||
        module == "condition_embedder.time_embedder.linear_2" || module == "proj_out") {
      std::string kohya = "lora_unet_" + module;
      std::replace(kohya.begin(), kohya.end(), '.', '_');
      narrow.emplace(kohya + ".lora_down.weight", factor({5, in}, 0.12));
      narrow.emplace(kohya + ".lora_up.weight", factor({out, 5}, 0.12));
      Tensor alpha = Tensor::empty({}, DType::kF32);
      alpha.data_as<float>()[0] = 10.0f;
      narrow.emplace(kohya + ".alpha", alpha);
    }
  }
  write((dir / "wide.safetensors").string(), wide);
  write((dir / "narrow.safetensors").string(), narrow);
  return {{"wide", {(dir / "wide.safetensors").string(), 0.8}}, {"narrow", {(dir / "narrow.safetensors").string(), 0.6}}};
}

TEST(WanLoraBankCuda, PerRequestMatchesMergedAndTheCpuForward) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const ScratchDir dir;
    const auto adapters = write_adapters(c.config, dir.path());
    const std::map<std::string, Tensor> weights = random_wan_weights(c.config, 31);
    const WanTransformer cpu(c.config, weights), gpu(c.config, weights, {}, Device::cuda());
    const WanLoraBank cpu_bank = WanLoraBank::load(adapters, c.config, Device::cpu());
    const WanLoraBank gpu_bank = WanLoraBank::load(adapters, c.config, Device::cuda());
    const Inputs in = make_inputs(c, 2, 40);
    const Tensor cpu_plain = run(cpu, in);
    const double yardstick = rel_l2(run(gpu, in), cpu_plain);
    for (int32_t adapter : {0, 1}) {
      const WanLoraSelection on_cpu{&cpu_bank, {adapter, adapter}}, on_gpu{&gpu_bank, {adapter, adapter}};
      const Tensor reference = run(cpu, in, &on_cpu), unmerged = run(gpu, in, &on_gpu);
      // The merged weights, rounded to bf16 by the CUDA model after merging.
      const WanLora lora = WanLora::load({adapters[static_cast<size_t>(adapter)].second}, c.config);
      std::map<std::string, Tensor> merged_weights;
      for (const auto& [name, tensor] : weights) merged_weights.emplace(name, lora.changes(name) ? lora.merged(name, tensor.view()) : tensor);
      const Tensor merged = run(WanTransformer(c.config, merged_weights, {}, Device::cuda()), in);
      const double to_cpu = rel_l2(unmerged, reference), to_merged = rel_l2(unmerged, merged), effect = rel_l2(reference, cpu_plain);
      std::printf("%s %s: E %.2e; per-request vs CPU %.2e, vs merged %.2e; the adapter moves the output by %.2e\n", c.name.c_str(),
                  gpu_bank.name(adapter).c_str(), yardstick, to_cpu, to_merged, effect);
      EXPECT_LT(to_cpu, 2 * yardstick);
      EXPECT_LT(to_merged, 2 * yardstick);
      EXPECT_GT(effect, 20 * yardstick) << "the adapter is too weak to tell a wrong update from rounding";
    }
  }
}

TEST(WanLoraBankCuda, MixedBatchEqualsEachEntryAlone) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const ScratchDir dir;
    const std::map<std::string, Tensor> weights = random_wan_weights(c.config, 47);
    const WanTransformer cpu(c.config, weights), gpu(c.config, weights, {}, Device::cuda());
    const WanLoraBank bank = WanLoraBank::load(write_adapters(c.config, dir.path()), c.config, Device::cuda());
    // Runs of one adapter, an entry without one between them, and an adapter that comes back.
    const std::vector<int32_t> adapters = {0, 0, -1, 1, 0};
    const Inputs batch = make_inputs(c, static_cast<int64_t>(adapters.size()), 60);
    const double yardstick = rel_l2(run(gpu, entry(batch, 0)), run(cpu, entry(batch, 0)));
    const WanLoraSelection mixed{&bank, adapters};
    const Tensor together = run(gpu, batch, &mixed);
    for (size_t b = 0; b < adapters.size(); ++b) {
      const auto i = static_cast<int64_t>(b);
      const WanLoraSelection own{&bank, {adapters[b]}};
      const Tensor alone = run(gpu, entry(batch, i), adapters[b] < 0 ? nullptr : &own);
      const double error = rel_l2(entry(together, i), alone);
      std::printf("%s entry %zu (adapter %d): batched vs alone %.2e (E %.2e)\n", c.name.c_str(), b, adapters[b], error, yardstick);
      EXPECT_LT(error, yardstick) << "entry " << b;
    }
    // The adapters differ by far more than the bound on every entry's inputs.
    const WanLoraSelection first{&bank, {0}}, second{&bank, {1}};
    EXPECT_GT(rel_l2(run(gpu, entry(batch, 0), &first), run(gpu, entry(batch, 0), &second)), 20 * yardstick);
  }
}

}  // namespace
}  // namespace tessel
