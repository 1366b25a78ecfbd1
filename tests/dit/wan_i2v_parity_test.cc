// The Wan transformer's image branch (Wan 2.1 I2V and FLF2V) against diffusers 0.42.1 on the
// committed fixture (scripts/make_wan_i2v_fixture.py: the tiny model of wan_parity_test.cc with 36
// input channels, image_dim 20, batch 2 with 512 text tokens and 5 image tokens; FLF2V with 2 x 5
// tokens and its position table). Tolerance as wan_parity_test.cc: the fp32 forward's rel-L2 from
// diffusers' float64 forward within 4e-6 (diffusers' own fp32 forward is 2.5e-7 from it); the image
// branch moves the output by far more than that (checked: a zero image changes it by > 1e-2).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "dit_test_util.h"
#include "error_of.h"
#include "tessel/core/exec_context.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/dit/wan_config.h"
#include "tessel/dit/wan_model.h"
#include "tessel/dit/wan_weights.h"

namespace tessel {
namespace {

using testing::error_of;

std::filesystem::path fixture_dir() { return test_support::source_dir() / "tests/fixtures/wan_i2v"; }

struct Fixture {
  std::map<std::string, Tensor> io;
  Fixture() {
    const SafetensorsFile file = SafetensorsFile::open((fixture_dir() / "io.safetensors").string());
    for (const SafetensorsEntry& entry : file.entries()) io.emplace(entry.name, file.load(entry.name));
  }
  const Tensor& at(const std::string& variant, const std::string& name) const { return io.at(variant + "_" + name); }
  Tensor run(const WanTransformer& model, const std::string& variant, const TensorView& image) const {
    Tensor out = Tensor::empty(at(variant, "output_fp64").shape(), DType::kF32);
    fill(out.view(), std::nan(""));
    ExecContext ctx;
    ctx.num_threads = 1;
    model.forward(ctx, {}, at(variant, "hidden_states"), at(variant, "timestep"), at(variant, "encoder_hidden_states"), image, out);
    return out;
  }
};

class WanI2vParity : public ::testing::TestWithParam<const char*> {};

TEST_P(WanI2vParity, MatchesDiffusersAndTheImageMatters) {
  const std::string variant = GetParam();
  const Fixture fixture;
  const WanTransformer model = WanTransformer::load((fixture_dir() / variant).string());
  ASSERT_TRUE(model.config().has_image_branch());
  const Tensor out = fixture.run(model, variant, fixture.at(variant, "encoder_hidden_states_image"));
  const double vs_fp64 = rel_l2(out, fixture.at(variant, "output_fp64"));
  const double vs_fp32 = rel_l2(out, fixture.at(variant, "output_fp32"));
  std::printf("%s: rel-L2 vs diffusers float64 %.3e, vs diffusers fp32 %.3e\n", variant.c_str(), vs_fp64, vs_fp32);
  EXPECT_LE(vs_fp64, 4e-6);
  EXPECT_LE(vs_fp32, 1e-4);
  // A test that cannot fail is no test: the image must move the output well past the tolerance.
  Tensor zero_image = Tensor::empty(fixture.at(variant, "encoder_hidden_states_image").shape(), DType::kF32);
  fill(zero_image.view(), 0.0);
  EXPECT_GT(rel_l2(fixture.run(model, variant, zero_image), fixture.at(variant, "output_fp64")), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Variants, WanI2vParity, ::testing::Values("i2v", "flf2v"));

TEST(WanI2v, TheImageArgumentIsCheckedAgainstTheModel) {
  const Fixture fixture;
  const WanTransformer model = WanTransformer::load((fixture_dir() / "i2v").string());
  const Tensor& latents = fixture.at("i2v", "hidden_states");
  const Tensor& timestep = fixture.at("i2v", "timestep");
  const Tensor& text = fixture.at("i2v", "encoder_hidden_states");
  Tensor out = Tensor::empty(fixture.at("i2v", "output_fp64").shape(), DType::kF32);
  ExecContext ctx;
  // The text-only overload on a model with an image branch.
  EXPECT_NE(error_of([&] { model.forward(ctx, {}, latents, timestep, text, out); }).find("image"), std::string::npos);
  // Wrong width, wrong batch.
  Tensor narrow = Tensor::empty({2, 5, 19}, DType::kF32);
  fill(narrow.view(), 0.0);
  EXPECT_NE(error_of([&] { model.forward(ctx, {}, latents, timestep, text, narrow, out); }).find("image"), std::string::npos);
  Tensor one_row = Tensor::empty({1, 5, 20}, DType::kF32);
  fill(one_row.view(), 0.0);
  EXPECT_NE(error_of([&] { model.forward(ctx, {}, latents, timestep, text, one_row, out); }).find("image"), std::string::npos);
  // FLF2V takes exactly its position table's tokens.
  const WanTransformer flf2v = WanTransformer::load((fixture_dir() / "flf2v").string());
  const std::string flf2v_error =
      error_of([&] { flf2v.forward(ctx, {}, latents, timestep, text, fixture.at("i2v", "encoder_hidden_states_image"), out); });
  EXPECT_NE(flf2v_error.find("pos_embed_seq_len"), std::string::npos) << flf2v_error;
  // A text-to-video model refuses an image.
  const WanTransformer t2v = WanTransformer::load(wan_fixture_dir() / "checkpoint");
  Tensor t2v_out = Tensor::empty({2, 16, 3, 10, 6}, DType::kF32);
  Tensor t2v_latents = Tensor::empty({2, 16, 3, 10, 6}, DType::kF32);
  fill(t2v_latents.view(), 0.0);
  Tensor t2v_text = Tensor::empty({2, 7, 24}, DType::kF32);
  fill(t2v_text.view(), 0.0);
  const std::string t2v_error =
      error_of([&] { t2v.forward(ctx, {}, t2v_latents, timestep, t2v_text, fixture.at("i2v", "encoder_hidden_states_image"), t2v_out); });
  EXPECT_NE(t2v_error.find("image_dim"), std::string::npos) << t2v_error;
}

TEST(WanI2v, ConfigFieldsOfTheImageBranchAreValidated) {
  const auto parse = [](const std::string& extra) {
    return parse_wan_config(R"({"num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 36)" + extra + "}");
  };
  const WanConfig i2v = parse(R"(, "image_dim": 1280, "added_kv_proj_dim": 32)");
  EXPECT_EQ(i2v.image_dim, 1280);
  EXPECT_EQ(i2v.added_kv_proj_dim, 32);
  EXPECT_EQ(i2v.pos_embed_seq_len, 0);
  // Wan 2.2 I2V-A14B: the image only through the input channels.
  EXPECT_FALSE(parse(R"(, "image_dim": null, "added_kv_proj_dim": null, "pos_embed_seq_len": null)").has_image_branch());
  EXPECT_NE(error_of([&] { parse(R"(, "image_dim": 1280)"); }).find("added_kv_proj_dim"), std::string::npos);
  EXPECT_NE(error_of([&] { parse(R"(, "image_dim": 1280, "added_kv_proj_dim": 64)"); }).find("inner width"), std::string::npos);
  EXPECT_NE(error_of([&] { parse(R"(, "pos_embed_seq_len": 514)"); }).find("pos_embed_seq_len"), std::string::npos);
  EXPECT_NE(error_of([&] { parse(R"(, "image_dim": 1280, "added_kv_proj_dim": 32, "pos_embed_seq_len": 7)"); }).find("even"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse(R"(, "image_dim": "big", "added_kv_proj_dim": 32)"); }).find("image_dim"), std::string::npos);
  // Every tensor of the branch is in the specs (so random checkpoints and LoRA tables cover it).
  size_t image_specs = 0;
  for (const WeightSpec& spec : wan_weight_specs(i2v))
    image_specs += spec.name.find("image_embedder") != std::string::npos || spec.name.find("add_") != std::string::npos ||
                   spec.name.find("norm_added_k") != std::string::npos;
  EXPECT_EQ(image_specs, 8u + 5u * 40u);  // the embedder's 8, five per block of the default 40 layers
}

// A CUDA model keeps the image embedder's GEMM weights and the blocks' image keys and values in
// bf16, and in fp32 what its fp32 path reads: the norms, the biases of the embedder's two linears
// (which write fp32 for the norm and the GELU) and FLF2V's position table.
TEST(WanI2v, CudaWeightDtypesOfTheImageBranch) {
  const std::string embedder = "condition_embedder.image_embedder.";
  for (const char* name : {"norm1.weight", "norm1.bias", "ff.net.0.proj.bias", "ff.net.2.bias", "norm2.weight", "norm2.bias", "pos_embed"})
    EXPECT_EQ(wan_cuda_weight_dtype(embedder + name), DType::kF32) << name;
  for (const char* name : {"ff.net.0.proj.weight", "ff.net.2.weight"}) EXPECT_EQ(wan_cuda_weight_dtype(embedder + name), DType::kBF16) << name;
  for (const char* name : {"attn2.add_k_proj.weight", "attn2.add_k_proj.bias", "attn2.add_v_proj.weight", "attn2.add_v_proj.bias"})
    EXPECT_EQ(wan_cuda_weight_dtype(wan_block_tensor(3, name)), DType::kBF16) << name;
  EXPECT_EQ(wan_cuda_weight_dtype(wan_block_tensor(3, "attn2.norm_added_k.weight")), DType::kF32);
}

}  // namespace
}  // namespace tessel
