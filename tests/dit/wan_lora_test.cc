// LoRA and weight-diff files for the Wan transformer (tessel/dit/wan_lora.h): every module of the
// model resolves in each naming people publish (diffusers, original Wan names with ComfyUI's
// prefix, kohya's underscored names), the merge is W + scale * alpha / rank * B A in every way
// alpha is given, bad files are errors naming the key, and (with the committed fixture written by
// scripts/make_lora_fixture.py) the merged model's forward matches diffusers' with the same LoRA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "error_of.h"
#include "dit_test_util.h"
#include "tessel/core/error.h"
#include "tessel/core/exec_context.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/random.h"
#include "tessel/dit/checkpoint.h"
#include "tessel/dit/wan_config.h"
#include "tessel/dit/wan_lora.h"
#include "tessel/dit/wan_model.h"
#include "tessel/dit/wan_weights.h"

namespace tessel {
namespace {

WanConfig fixture_config() { return load_wan_config((wan_fixture_dir() / "checkpoint").string()); }

std::map<std::string, Shape> spec_shapes(const WanConfig& config) {
  std::map<std::string, Shape> shapes;
  for (const WeightSpec& spec : wan_weight_specs(config)) shapes.emplace(spec.name, spec.shape);
  return shapes;
}

Tensor random_tensor(const Shape& shape, uint64_t seed, double scale = 0.1) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  fill_uniform(t.view(), seed, -scale, scale);
  return t;
}

std::string underscored(std::string name) {
  for (char& c : name)
    if (c == '.') c = '_';
  return name;
}

void write(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors,
           const std::map<std::string, std::string>& metadata = {}) {
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [name, tensor] : tensors) views.emplace_back(name, tensor.view());
  write_safetensors(path.string(), views, metadata);
}

using testing::error_of;

// Every module of the model, in each naming: a rank-2 LoRA pair on the linear layers (2-D
// weights) and a full diff on the others (norm weights, modulation tables, the Conv3d patch
// embedding). Each naming resolves every module, and changes exactly the tensors it names.
TEST(WanLora, EveryModuleResolvesInEveryNaming) {
  const WanConfig config = fixture_config();
  const std::map<std::string, Shape> shapes = spec_shapes(config);
  const auto aliases = wan_lora_module_aliases(config);
  ASSERT_GT(aliases.size(), 20u);
  // Spot checks of the table against diffusers' conversion (lora_conversion_utils.py).
  const std::map<std::string, std::string> table(aliases.begin(), aliases.end());
  EXPECT_EQ(table.at("blocks.1.attn1.to_out.0"), "blocks.1.self_attn.o");
  EXPECT_EQ(table.at("blocks.0.attn2.to_k"), "blocks.0.cross_attn.k");
  EXPECT_EQ(table.at("blocks.0.ffn.net.0.proj"), "blocks.0.ffn.0");
  EXPECT_EQ(table.at("blocks.0.norm2"), "blocks.0.norm3");
  EXPECT_EQ(table.at("blocks.1.scale_shift_table"), "blocks.1.modulation");
  EXPECT_EQ(table.at("condition_embedder.time_proj"), "time_projection.1");
  EXPECT_EQ(table.at("condition_embedder.text_embedder.linear_2"), "text_embedding.2");
  EXPECT_EQ(table.at("proj_out"), "head.head");
  EXPECT_EQ(table.at("scale_shift_table"), "head.modulation");

  const ScratchDir dir;
  enum Naming { kDiffusers, kComfy, kKohya };
  for (const Naming naming : {kDiffusers, kComfy, kKohya}) {
    std::map<std::string, Tensor> tensors;
    uint64_t seed = 1;
    std::vector<std::string> changed;
    for (const auto& [diffusers, original] : aliases) {
      const std::string weight = shapes.count(diffusers + ".weight") ? diffusers + ".weight" : diffusers;
      const Shape& shape = shapes.at(weight);
      const std::string stem = naming == kDiffusers ? "transformer." + diffusers
                               : naming == kComfy   ? "diffusion_model." + original
                                                    : "lora_unet_" + underscored(original);
      if (shape.size() == 2) {
        tensors[stem + (naming == kDiffusers ? ".lora_A.weight" : ".lora_down.weight")] = random_tensor({2, shape[1]}, ++seed);
        tensors[stem + (naming == kDiffusers ? ".lora_B.weight" : ".lora_up.weight")] = random_tensor({shape[0], 2}, ++seed);
      } else {
        tensors[stem + ".diff"] = random_tensor(shape, ++seed);
      }
      changed.push_back(weight);
    }
    const std::filesystem::path path = dir.path() / ("naming" + std::to_string(naming) + ".safetensors");
    write(path, tensors);
    const WanLora lora = WanLora::load({{path.string(), 0.5}}, config);
    for (const std::string& tensor : changed) EXPECT_TRUE(lora.changes(tensor)) << tensor << " in naming " << naming;
    EXPECT_FALSE(lora.changes("blocks.0.attn1.to_q.bias"));
    ASSERT_EQ(lora.summary().size(), 1u);
    EXPECT_NE(lora.summary()[0].find(std::to_string(aliases.size()) + " modules"), std::string::npos) << lora.summary()[0];
  }
}

// W + scale * alpha / rank * B A against an fp64 sum, with alpha from a kohya .alpha tensor, from
// diffusers' safetensors metadata, from PEFT's adapter_config.json and absent (1); bias diffs and a
// full diff add scale times themselves; two files add up.
TEST(WanLora, MergeIsScaleAlphaOverRankTimesBA) {
  const WanConfig config = fixture_config();
  const Shape w_shape = spec_shapes(config).at("blocks.0.attn1.to_q.weight");
  const int64_t out = w_shape[0], in = w_shape[1], rank = 3;
  const Tensor base = random_tensor(w_shape, 100, 1.0);
  const Tensor down = random_tensor({rank, in}, 101), up = random_tensor({out, rank}, 102);
  const Tensor diff = random_tensor(w_shape, 103);
  const auto expected_with = [&](double lora_factor, double diff_factor) {
    Tensor result = Tensor::empty(w_shape, DType::kF32);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double sum = 0.0;
        for (int64_t k = 0; k < rank; ++k) sum += static_cast<double>(up.data_as<float>()[o * rank + k]) * down.data_as<float>()[k * in + i];
        result.data_as<float>()[o * in + i] =
            static_cast<float>(base.data_as<float>()[o * in + i] + lora_factor * sum + diff_factor * diff.data_as<float>()[o * in + i]);
      }
    return result;
  };
  const ScratchDir dir;
  const auto check = [&](const std::vector<LoraFile>& files, double lora_factor, double diff_factor, const std::string& what) {
    const WanLora lora = WanLora::load(files, config);
    const Tensor merged = lora.merged("blocks.0.attn1.to_q.weight", base.view());
    EXPECT_LT(rel_l2(merged, expected_with(lora_factor, diff_factor)), 1e-6) << what;
  };
  Tensor alpha = Tensor::empty({}, DType::kF32);
  alpha.data_as<float>()[0] = 6.0f;
  write(dir.path() / "kohya.safetensors", {{"lora_unet_blocks_0_self_attn_q.lora_down.weight", down},
                                           {"lora_unet_blocks_0_self_attn_q.lora_up.weight", up},
                                           {"lora_unet_blocks_0_self_attn_q.alpha", alpha}});
  check({{(dir.path() / "kohya.safetensors").string(), 0.5}}, 0.5 * 6.0 / rank, 0.0, "kohya .alpha");
  const std::map<std::string, Tensor> peft{{"transformer.blocks.0.attn1.to_q.lora_A.weight", down},
                                           {"transformer.blocks.0.attn1.to_q.lora_B.weight", up}};
  write(dir.path() / "meta.safetensors", peft, {{"lora_adapter_metadata", R"({"transformer.r": 3, "transformer.lora_alpha": 12})"}});
  check({{(dir.path() / "meta.safetensors").string(), 1.0}}, 12.0 / rank, 0.0, "diffusers metadata");
  std::filesystem::create_directories(dir.path() / "peft");
  write(dir.path() / "peft" / "adapter_model.safetensors", peft);
  {
    std::ofstream(dir.path() / "peft" / "adapter_config.json") << R"({"r": 3, "lora_alpha": 1.5, "peft_type": "LORA"})";
  }
  check({{(dir.path() / "peft" / "adapter_model.safetensors").string(), 2.0}}, 2.0 * 1.5 / rank, 0.0, "adapter_config.json");
  write(dir.path() / "plain.safetensors", peft);
  check({{(dir.path() / "plain.safetensors").string(), 0.25}}, 0.25, 0.0, "no alpha: scale 1");
  write(dir.path() / "diff.safetensors", {{"diffusion_model.blocks.0.self_attn.q.diff", diff}});
  check({{(dir.path() / "diff.safetensors").string(), 0.75}}, 0.0, 0.75, "full diff");
  check({{(dir.path() / "plain.safetensors").string(), 0.25}, {(dir.path() / "diff.safetensors").string(), 0.75}}, 0.25, 0.75,
        "two files");

  // A bias diff.
  const Shape b_shape = spec_shapes(config).at("blocks.0.attn1.to_q.bias");
  const Tensor bias = random_tensor(b_shape, 104, 1.0), diff_b = random_tensor(b_shape, 105);
  write(dir.path() / "diff_b.safetensors", {{"diffusion_model.blocks.0.self_attn.q.diff_b", diff_b}});
  const WanLora lora = WanLora::load({{(dir.path() / "diff_b.safetensors").string(), 2.0}}, config);
  const Tensor merged = lora.merged("blocks.0.attn1.to_q.bias", bias.view());
  for (int64_t i = 0; i < bias.numel(); ++i)
    EXPECT_FLOAT_EQ(merged.data_as<float>()[i], bias.data_as<float>()[i] + 2.0f * diff_b.data_as<float>()[i]);
}

TEST(WanLora, BadFilesAreErrorsNamingTheKey) {
  const WanConfig config = fixture_config();
  const Shape w_shape = spec_shapes(config).at("blocks.0.attn1.to_q.weight");
  const Tensor down = random_tensor({2, w_shape[1]}, 1), up = random_tensor({w_shape[0], 2}, 2);
  const ScratchDir dir;
  const auto path = [&](const std::string& name) { return (dir.path() / name).string(); };
  const auto load_error = [&](const std::string& name, bool ignore = false) {
    return error_of([&] { WanLora::load({{path(name), 1.0}}, config, ignore); });
  };
  const std::string a = "transformer.blocks.0.attn1.to_q.lora_A.weight", b = "transformer.blocks.0.attn1.to_q.lora_B.weight";

  write(dir.path() / "unmatched.safetensors", {{a, down}, {b, up}, {"transformer.blocks.0.attn1.to_zz.lora_A.weight", down}});
  std::string message = load_error("unmatched.safetensors");
  EXPECT_NE(message.find("to_zz"), std::string::npos) << message;
  EXPECT_NE(message.find("--lora-ignore-unmatched"), std::string::npos) << message;
  const WanLora ignored = WanLora::load({{path("unmatched.safetensors"), 1.0}}, config, true);
  EXPECT_TRUE(ignored.changes("blocks.0.attn1.to_q.weight"));
  EXPECT_NE(ignored.summary()[0].find("1 keys ignored"), std::string::npos) << ignored.summary()[0];

  // Image-branch keys on a text-to-video model are unmatched too (the model has no such module).
  write(dir.path() / "i2v.safetensors", {{"diffusion_model.blocks.0.cross_attn.k_img.lora_down.weight", down},
                                        {"diffusion_model.blocks.0.cross_attn.k_img.lora_up.weight", up}});
  message = load_error("i2v.safetensors", true);
  EXPECT_NE(message.find("no key matched"), std::string::npos) << message;

  write(dir.path() / "half.safetensors", {{a, down}});
  EXPECT_NE(load_error("half.safetensors").find("both halves"), std::string::npos);
  write(dir.path() / "rank.safetensors", {{a, down}, {b, random_tensor({w_shape[0], 3}, 3)}});
  message = load_error("rank.safetensors");
  EXPECT_NE(message.find("lora_A"), std::string::npos) << message;
  EXPECT_NE(message.find("(32, 3)"), std::string::npos) << message;
  write(dir.path() / "in.safetensors", {{a, random_tensor({2, w_shape[1] + 1}, 4)}, {b, up}});
  EXPECT_NE(load_error("in.safetensors").find("blocks.0.attn1.to_q.weight"), std::string::npos);
  write(dir.path() / "diff.safetensors", {{"diffusion_model.blocks.0.self_attn.q.diff", random_tensor({3, 3}, 5)}});
  EXPECT_NE(load_error("diff.safetensors").find("(3, 3)"), std::string::npos);
  Tensor nan_down = random_tensor({2, w_shape[1]}, 6);
  nan_down.data_as<float>()[3] = std::nanf("");
  write(dir.path() / "nan.safetensors", {{a, nan_down}, {b, up}});
  message = load_error("nan.safetensors");
  EXPECT_NE(message.find(a), std::string::npos) << message;
  EXPECT_NE(message.find("non-finite"), std::string::npos) << message;
  write(dir.path() / "pattern.safetensors", {{a, down}, {b, up}},
        {{"lora_adapter_metadata", R"({"r": 2, "lora_alpha": 4, "alpha_pattern": {"to_q": 8}})"}});
  EXPECT_NE(load_error("pattern.safetensors").find("alpha_pattern"), std::string::npos);
  write(dir.path() / "badrank.safetensors", {{a, down}, {b, up}}, {{"lora_adapter_metadata", R"({"r": 8, "lora_alpha": 8})"}});
  EXPECT_NE(load_error("badrank.safetensors").find("adapter's r"), std::string::npos);
  EXPECT_NE(load_error("missing.safetensors").find("missing.safetensors"), std::string::npos);
}

// The committed fixture (scripts/make_lora_fixture.py): one rank-4 adapter (alpha 8) on every
// linear layer of the tiny Wan, saved as PEFT writes it (alpha in lora_adapter_metadata), as PEFT's
// adapter directory (adapter_config.json), as kohya (bf16, .alpha) and as ComfyUI (fp16, .alpha),
// and LightX2V-style full diffs of weights, biases, a norm and the modulation tables; each file's
// reference is the float64 forward of the weights merged from the values as stored, checked by the
// script against diffusers' own LoRA loading where diffusers loads the format. The fp32 forward's
// bound is wan_parity_test's (4e-6: ~16x diffusers' own fp32 error; a LoRA merged at the wrong
// scale or into the wrong module moves the output by more than 1e-2).
TEST(WanLora, MergedForwardMatchesDiffusersInEveryFormat) {
  const std::filesystem::path dir = test_support::source_dir() / "tests/fixtures/wan_lora";
  std::map<std::string, Tensor> io, expected;
  const SafetensorsFile io_file = SafetensorsFile::open((wan_fixture_dir() / "io.safetensors").string());
  for (const SafetensorsEntry& entry : io_file.entries()) io.emplace(entry.name, io_file.load(entry.name));
  const SafetensorsFile expected_file = SafetensorsFile::open((dir / "expected.safetensors").string());
  for (const SafetensorsEntry& entry : expected_file.entries()) expected.emplace(entry.name, expected_file.load(entry.name));
  const double lora_scale = std::stod(expected_file.metadata().at("lora_scale"));
  const auto forward = [&](const std::vector<LoraFile>& files) {
    const WanConfig config = fixture_config();
    const WanLora lora = WanLora::load(files, config);
    const WanTransformer model = WanTransformer::load((wan_fixture_dir() / "checkpoint").string(), {}, Device::cpu(), &lora);
    Tensor out = Tensor::empty(expected.at("output_base").shape(), DType::kF32);
    fill(out.view(), std::nan(""));
    ExecContext ctx;
    ctx.num_threads = 1;
    model.forward(ctx, {}, io.at("hidden_states"), io.at("timestep"), io.at("encoder_hidden_states"), out);
    return out;
  };
  const std::string peft = (dir / "peft" / "adapter_model.safetensors").string();
  const std::string diff = (dir / "diff.safetensors").string();
  const std::vector<std::pair<std::string, std::vector<LoraFile>>> cases = {
      {"output_base", {}},
      {"output_peft", {{peft, lora_scale}}},
      {"output_kohya", {{(dir / "kohya.safetensors").string(), lora_scale}}},
      {"output_comfy", {{(dir / "comfy.safetensors").string(), lora_scale}}},
      {"output_diff", {{diff, std::stod(expected_file.metadata().at("diff_scale"))}}},
      {"output_peft_and_diff", {{peft, lora_scale}, {diff, 1.0}}}};
  for (const auto& [name, files] : cases) {
    const Tensor out = forward(files);
    const double error = rel_l2(out, expected.at(name));
    std::printf("%s: rel-L2 %.2e against the float64 reference\n", name.c_str(), error);
    EXPECT_LT(error, 4e-6) << name;
    if (name != "output_base") EXPECT_GT(rel_l2(expected.at(name), expected.at("output_base")), 1e-2) << name << " changes the output";
  }
}

TEST(WanLora, PathAndScaleArguments) {
  EXPECT_EQ(parse_lora_file("a.safetensors", "--lora").scale, 1.0);
  const LoraFile scaled = parse_lora_file("dir/a.safetensors:0.5", "--lora");
  EXPECT_EQ(scaled.path, "dir/a.safetensors");
  EXPECT_EQ(scaled.scale, 0.5);
  EXPECT_EQ(parse_lora_file("C:/x.safetensors", "--lora").path, "C:/x.safetensors");  // not a number after ':'
  EXPECT_EQ(parse_lora_file("a:b.safetensors:-1e-1", "--lora").scale, -0.1);
  EXPECT_NE(error_of([] { parse_lora_file(":0.5", "--lora"); }).find("--lora"), std::string::npos);
  EXPECT_NE(error_of([] { parse_lora_file("a.safetensors:inf", "--lora"); }).find("finite"), std::string::npos);
  EXPECT_NE(error_of([] { parse_lora_file("", "--lora-2"); }).find("--lora-2"), std::string::npos);
}

}  // namespace
}  // namespace tessel
