// Wan config.json parsing and the checkpoint loader: the committed diffusers fixture loads, and
// each kind of broken checkpoint (missing, mis-shaped or unexpected tensor, malformed index,
// image-conditioned config) fails with a message that names the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dit_test_util.h"
#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/dit/checkpoint.h"
#include "tessel/dit/wan_config.h"
#include "tessel/dit/wan_weights.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

const std::string kIndexName = kDiffusersWeightsIndex;
const std::string kSingleName = kDiffusersWeightsFile;

// Expects `body` to throw tessel::Error whose message contains every one of `parts`.
template <typename Body>
void expect_error(Body&& body, const std::vector<std::string>& parts) {
  try {
    body();
    ADD_FAILURE() << "no Error thrown; expected one mentioning " << parts.front();
  } catch (const Error& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "'" << part << "' not in: " << e.what();
  }
}

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

// The single-file bf16 checkpoint rewritten by `edit` (which gets the tensors in file order).
fs::path edited_single_file(const ScratchDir& scratch, const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
  const fs::path dir = scratch.copy_of(wan_fixture_dir() / "checkpoint_bf16");
  const SafetensorsFile file = SafetensorsFile::open((dir / kSingleName).string());
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const SafetensorsEntry& entry : file.entries()) tensors.emplace_back(entry.name, file.load(entry.name));
  edit(tensors);
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [name, tensor] : tensors) views.emplace_back(name, tensor.view());
  write_safetensors((dir / kSingleName).string(), views);
  return dir;
}

TEST(WanConfig, ParsesTheFixturesConfigJson) {
  const WanConfig config = load_wan_config(wan_fixture_dir() / "checkpoint");
  EXPECT_EQ(config.num_attention_heads, 2);
  EXPECT_EQ(config.attention_head_dim, 16);
  EXPECT_EQ(config.inner_dim(), 32);
  EXPECT_EQ(config.text_dim, 24);
  EXPECT_EQ(config.freq_dim, 16);
  EXPECT_EQ(config.ffn_dim, 64);
  EXPECT_EQ(config.num_layers, 2);
  EXPECT_EQ(config.rope_max_seq_len, 32);
  EXPECT_TRUE(config.cross_attn_norm);
  EXPECT_EQ(config.patch_size, (std::array<int64_t, 3>{1, 2, 2}));
}

TEST(WanConfig, PresetsHaveThePublishedSizes) {
  const WanConfig small = wan_preset("wan-1.3b");
  EXPECT_EQ(small.inner_dim(), 1536);
  EXPECT_EQ(small.num_layers, 30);
  EXPECT_EQ(small.ffn_dim, 8960);
  const WanConfig large = wan_preset("wan-14b");
  EXPECT_EQ(large.inner_dim(), 5120);
  EXPECT_EQ(large.num_layers, 40);
  EXPECT_EQ(large.ffn_dim, 13824);
  expect_error([] { wan_preset("wan-7b"); }, {"wan-7b", "wan-1.3b", "wan-14b"});
}

TEST(WanConfig, ImageBranchFieldsComeTogether) {
  expect_error([] { parse_wan_config(R"({"image_dim": 1280})"); }, {"image_dim", "added_kv_proj_dim", "both"});
  expect_error([] { parse_wan_config(R"({"added_kv_proj_dim": 5120})"); }, {"added_kv_proj_dim", "both"});
  EXPECT_TRUE(parse_wan_config(R"({"image_dim": 1280, "added_kv_proj_dim": 5120})").has_image_branch());
  EXPECT_NO_THROW(parse_wan_config(R"({"image_dim": null, "added_kv_proj_dim": null, "_class_name": "X"})"));
}

TEST(WanConfig, RejectsUnknownKeysWrongTypesAndBadValues) {
  expect_error([] { parse_wan_config(R"({"num_heads": 4})"); }, {"unknown key", "num_heads"});
  expect_error([] { parse_wan_config(R"({"num_layers": "30"})"); }, {"num_layers", "an integer"});
  expect_error([] { parse_wan_config(R"({"ffn_dim": 0})"); }, {"ffn_dim", "[1, "});
  expect_error([] { parse_wan_config(R"({"patch_size": [1, 2]})"); }, {"patch_size", "3 integers"});
  expect_error([] { parse_wan_config(R"({"attention_head_dim": 15})"); }, {"attention_head_dim", "even", "15"});
  expect_error([] { parse_wan_config(R"({"qk_norm": "layer_norm"})"); }, {"qk_norm", "rms_norm_across_heads"});
  expect_error([] { parse_wan_config(R"({"eps": -1})"); }, {"eps"});
  expect_error([] { parse_wan_config("[1, 2]"); }, {"a JSON object"});
}

TEST(WanCheckpoint, ShardedAndSingleFileCheckpointsLoadEveryTensor) {
  const WanConfig config = load_wan_config(wan_fixture_dir() / "checkpoint");
  const std::vector<WeightSpec> specs = wan_weight_specs(config);
  const Checkpoint sharded = Checkpoint::open(wan_fixture_dir() / "checkpoint");
  const Checkpoint single = Checkpoint::open(wan_fixture_dir() / "checkpoint_bf16");
  EXPECT_EQ(sharded.tensor_names().size(), specs.size());
  EXPECT_EQ(sharded.find("proj_out.weight")->dtype, DType::kF32);
  EXPECT_EQ(single.find("proj_out.weight")->dtype, DType::kBF16);

  const auto from_shards = load_weights(sharded, specs, DType::kF32);
  const auto from_bf16 = load_weights(single, specs, DType::kF32);
  ASSERT_EQ(from_shards.size(), specs.size());
  // The bf16 file holds the fp32 weights rounded to bf16: each value within bf16's half ulp.
  for (const WeightSpec& spec : specs) {
    const Tensor& a = from_shards.at(spec.name);
    const Tensor& b = from_bf16.at(spec.name);
    ASSERT_EQ(a.dtype(), DType::kF32);
    ASSERT_EQ(a.shape(), spec.shape) << spec.name;
    for (int64_t i = 0; i < a.numel(); ++i) {
      const float x = a.data_as<float>()[i];
      ASSERT_NEAR(b.data_as<float>()[i], x, std::abs(x) * (1.0f / 256) + 1e-30f) << spec.name << "[" << i << "]";
    }
  }
}

TEST(WanCheckpoint, Fp16StoredTensorsConvertLikeTheirBf16Source) {
  ScratchDir scratch;
  const fs::path dir = edited_single_file(scratch, [](auto& tensors) {
    for (auto& [name, tensor] : tensors) tensor = tensor.to(DType::kF32).to(DType::kF16);
  });
  const std::vector<WeightSpec> specs = wan_weight_specs(load_wan_config(dir));
  const auto from_fp16 = load_weights(Checkpoint::open(dir), specs, DType::kF32);
  const auto from_bf16 = load_weights(Checkpoint::open(wan_fixture_dir() / "checkpoint_bf16"), specs, DType::kF32);
  // fp16 keeps bf16's mantissa; only values below fp16's normal range (6.1e-5) lose bits, down to
  // its subnormal spacing 6e-8.
  for (const WeightSpec& spec : specs)
    for (int64_t i = 0; i < from_bf16.at(spec.name).numel(); ++i) {
      const float expected = from_bf16.at(spec.name).data_as<float>()[i];
      const float tolerance = std::abs(expected) >= 6.2e-5f ? 0.0f : 6e-8f;
      ASSERT_NEAR(from_fp16.at(spec.name).data_as<float>()[i], expected, tolerance) << spec.name << "[" << i << "]";
    }
}

TEST(WanCheckpoint, MissingTensorIsNamed) {
  ScratchDir scratch;
  const fs::path dir = scratch.copy_of(wan_fixture_dir() / "checkpoint");
  auto index = read_json(dir / kIndexName);
  index["weight_map"].erase("blocks.1.ffn.net.2.bias");
  write_text(dir / kIndexName, index.dump());
  const WanConfig config = load_wan_config(dir);
  expect_error([&] { load_weights(Checkpoint::open(dir), wan_weight_specs(config), DType::kF32); },
               {"missing 1 tensor", "blocks.1.ffn.net.2.bias"});
}

TEST(WanCheckpoint, WrongShapeNamesTheTensorAndBothShapes) {
  ScratchDir scratch;
  const fs::path dir = edited_single_file(scratch, [](auto& tensors) {
    for (auto& [name, tensor] : tensors)
      if (name == "blocks.0.attn1.to_q.weight") tensor = Tensor::zeros({32, 16}, DType::kBF16);
  });
  const WanConfig config = load_wan_config(dir);
  expect_error([&] { load_weights(Checkpoint::open(dir), wan_weight_specs(config), DType::kF32); },
               {"blocks.0.attn1.to_q.weight", "(32, 16)", "(32, 32)"});
}

TEST(WanCheckpoint, UnexpectedTensorIsNamed) {
  ScratchDir scratch;
  const fs::path dir = edited_single_file(scratch, [](auto& tensors) {
    tensors.emplace_back("blocks.0.attn2.add_k_proj.weight", Tensor::zeros({32, 8}, DType::kBF16));
  });
  const WanConfig config = load_wan_config(dir);
  expect_error([&] { load_weights(Checkpoint::open(dir), wan_weight_specs(config), DType::kF32); },
               {"1 unexpected tensor", "blocks.0.attn2.add_k_proj.weight"});
}

TEST(WanCheckpoint, MalformedIndexIsRejected) {
  ScratchDir scratch;
  const fs::path dir = scratch.copy_of(wan_fixture_dir() / "checkpoint");
  write_text(dir / kIndexName, "{\"weight_map\": {\"a\": ");
  expect_error([&] { Checkpoint::open(dir); }, {kIndexName});

  write_text(dir / kIndexName, R"({"metadata": {}})");
  expect_error([&] { Checkpoint::open(dir); }, {kIndexName, "weight_map"});

  write_text(dir / kIndexName, R"({"weight_map": {"proj_out.weight": 7}})");
  expect_error([&] { Checkpoint::open(dir); }, {"proj_out.weight", "shard file name"});

  write_text(dir / kIndexName, R"({"weight_map": {"proj_out.weight": "../checkpoint_bf16/diffusion_pytorch_model.safetensors"}})");
  expect_error([&] { Checkpoint::open(dir); }, {"proj_out.weight", "no folder part"});

  write_text(dir / kIndexName, R"({"weight_map": {"proj_out.weight": "absent.safetensors"}})");
  expect_error([&] { Checkpoint::open(dir); }, {"proj_out.weight", "absent.safetensors", "does not exist"});

  write_text(dir / kIndexName, R"({"weight_map": {"proj_out.weight": "diffusion_pytorch_model-00001-of-00005.safetensors"}})");
  expect_error([&] { Checkpoint::open(dir); }, {"proj_out.weight", "does not hold it"});
}

TEST(WanCheckpoint, DirectoryWithoutWeightsIsRejected) {
  ScratchDir scratch;
  const fs::path dir = scratch.path() / "empty";
  fs::create_directories(dir);
  expect_error([&] { Checkpoint::open(dir); }, {kIndexName, kSingleName, "found neither"});
  expect_error([&] { Checkpoint::open((dir / "absent").string()); }, {"checkpoint directory", "an existing directory"});
  expect_error([&] { load_wan_config(dir); }, {"config.json"});
}

}  // namespace
}  // namespace tessel
