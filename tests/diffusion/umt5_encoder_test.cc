// The UMT5 text encoder against transformers' UMT5EncoderModel (tests/fixtures/diffusion/umt5/,
// written by scripts/make_umt5_fixture.py): a tiny random model with 8 relative-position buckets
// over a maximum distance of 16, so both the exact and the logarithmic buckets are used, and a
// batch whose second row is padded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <fstream>
#include <sstream>

#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/umt5_encoder.h"
#include "tessel/diffusion/wan_pipeline.h"
#include "diffusion/diffusion_test_util.h"

namespace tessel {
namespace {

const std::string kDir = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/diffusion/umt5";

UMT5Encoder load_fixture_encoder() {
  const auto [config, weights] = load_umt5_fixture(kDir);
  return UMT5Encoder(config, weights);
}

TEST(UMT5Encoder, MatchesTransformers) {
  const UMT5Encoder encoder = load_fixture_encoder();
  const SafetensorsFile io = SafetensorsFile::open(kDir + "/io.safetensors");
  const Tensor ids = io.load("input_ids"), mask = io.load("attention_mask"), expected = io.load("last_hidden_state");
  Tensor out = Tensor::empty(expected.shape(), DType::kF32);
  encoder.forward(ExecContext{}, ids, mask, out);
  // rel-L2 over the tokens that are not padding (transformers' output at padding is not used).
  double diff = 0.0, norm = 0.0;
  const int64_t width = expected.size(2);
  for (int64_t row = 0; row < ids.numel(); ++row) {
    if (mask.data_as<int32_t>()[row] == 0) continue;
    for (int64_t i = 0; i < width; ++i) {
      const double want = expected.data_as<float>()[row * width + i];
      const double got = out.data_as<float>()[row * width + i];
      diff += (got - want) * (got - want);
      norm += want * want;
    }
  }
  const double error = std::sqrt(diff / norm);
  std::printf("UMT5 rel-L2 vs transformers float64: %.3g\n", error);
  EXPECT_LE(error, 1e-5);
}

TEST(UMT5Encoder, LoadsATransformersDirectory) {
  const UMT5Encoder loaded = UMT5Encoder::load(kDir);
  const UMT5Encoder built = load_fixture_encoder();
  const SafetensorsFile io = SafetensorsFile::open(kDir + "/io.safetensors");
  const Tensor ids = io.load("input_ids"), mask = io.load("attention_mask");
  Tensor a = Tensor::empty({2, 9, 32}, DType::kF32), b = Tensor::empty({2, 9, 32}, DType::kF32);
  loaded.forward(ExecContext{}, ids, mask, a);
  built.forward(ExecContext{}, ids, mask, b);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  EXPECT_EQ(loaded.config().relative_attention_num_buckets, 8);
  EXPECT_THROW(UMT5Encoder::load(kDir + "/missing"), Error);

  // The same weights in two shards named by an index, the embedding under its encoder name.
  const std::filesystem::path sharded = std::filesystem::path(::testing::TempDir()) / ("umt5_sharded_" + std::to_string(::getpid()));
  std::filesystem::create_directories(sharded);
  std::filesystem::copy_file(kDir + "/config.json", sharded / "config.json", std::filesystem::copy_options::overwrite_existing);
  const SafetensorsFile file = SafetensorsFile::open(kDir + "/model.safetensors");
  std::vector<Tensor> tensors;
  std::vector<std::pair<std::string, TensorView>> first, second;
  nlohmann::json index;
  for (const SafetensorsEntry& entry : file.entries()) {
    tensors.push_back(file.load(entry.name));
    const std::string name = entry.name == "shared.weight" ? "encoder.embed_tokens.weight" : entry.name;
    const bool in_first = entry.name.find("block.1.") == std::string::npos;
    (in_first ? first : second).push_back({name, tensors.back().view()});
    index["weight_map"][name] = in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors((sharded / "model-00001-of-00002.safetensors").string(), first);
  write_safetensors((sharded / "model-00002-of-00002.safetensors").string(), second);
  std::ofstream(sharded / "model.safetensors.index.json") << index.dump();
  Tensor c = Tensor::empty({2, 9, 32}, DType::kF32);
  UMT5Encoder::load(sharded.string()).forward(ExecContext{}, ids, mask, c);
  EXPECT_EQ(std::memcmp(c.data(), b.data(), c.nbytes()), 0);
}

TEST(UMT5Encoder, WanPromptEmbeddingsZeroThePadding) {
  const UMT5Encoder encoder = load_fixture_encoder();
  const SafetensorsFile io = SafetensorsFile::open(kDir + "/io.safetensors");
  const Tensor ids = io.load("input_ids"), mask = io.load("attention_mask");
  Tensor raw = Tensor::empty({2, 9, 32}, DType::kF32);
  encoder.forward(ExecContext{}, ids, mask, raw);
  const Tensor embeddings = wan_prompt_embeddings(ExecContext{}, encoder, ids, mask);
  for (int64_t row = 0; row < 2; ++row)
    for (int64_t token = 0; token < 9; ++token)
      for (int64_t i = 0; i < 32; ++i) {
        const int64_t at = (row * 9 + token) * 32 + i;
        const bool padding = row == 1 && token >= 5;  // the fixture's second row has 5 tokens
        EXPECT_EQ(embeddings.data_as<float>()[at], padding ? 0.0f : raw.data_as<float>()[at]) << row << " " << token;
      }
}

// The encoder runs on the positions up to the last token only: with padding after every row, the
// embeddings equal the encoder over the whole padded length (rows zeroed past their tokens), within
// fp32 reassociation. Rows of no token at all give zeros.
TEST(UMT5Encoder, WanPromptEmbeddingsSkipTheTrailingPadding) {
  const UMT5Encoder encoder = load_fixture_encoder();
  const SafetensorsFile io = SafetensorsFile::open(kDir + "/io.safetensors");
  const Tensor fixture_ids = io.load("input_ids"), fixture_mask = io.load("attention_mask");
  constexpr int64_t kLength = 23, kWidth = 32;
  Tensor ids = Tensor::zeros({2, kLength}, DType::kI32), mask = Tensor::zeros({2, kLength}, DType::kI32);
  const int64_t kept[] = {7, 5};  // both rows end before the fixture's 9 positions
  for (int64_t row = 0; row < 2; ++row)
    for (int64_t i = 0; i < kept[row]; ++i) {
      ids.data_as<int32_t>()[row * kLength + i] = fixture_ids.data_as<const int32_t>()[row * 9 + i];
      mask.data_as<int32_t>()[row * kLength + i] = 1;
    }
  Tensor whole = Tensor::empty({2, kLength, kWidth}, DType::kF32);
  encoder.forward(ExecContext{}, ids, mask, whole);
  const Tensor embeddings = wan_prompt_embeddings(ExecContext{}, encoder, ids, mask);
  double worst = 0.0;
  for (int64_t row = 0; row < 2; ++row)
    for (int64_t token = 0; token < kLength; ++token)
      for (int64_t i = 0; i < kWidth; ++i) {
        const int64_t at = (row * kLength + token) * kWidth + i;
        if (token >= kept[row]) {
          ASSERT_EQ(embeddings.data_as<float>()[at], 0.0f) << row << " " << token;
        } else {
          const double expected = whole.data_as<float>()[at];
          worst = std::max(worst, std::abs(embeddings.data_as<float>()[at] - expected) / (std::abs(expected) + 1e-3));
        }
      }
  EXPECT_LT(worst, 1e-5);
  (void)fixture_mask;
  const Tensor none = wan_prompt_embeddings(ExecContext{}, encoder, ids, Tensor::zeros({2, kLength}, DType::kI32));
  for (int64_t i = 0; i < none.numel(); ++i) ASSERT_EQ(none.data_as<float>()[i], 0.0f);
  EXPECT_THROW(wan_prompt_embeddings(ExecContext{}, encoder, ids, Tensor::zeros({2, kLength - 1}, DType::kI32)), Error);
}

TEST(UMT5Encoder, BadInputsAreErrors) {
  const UMT5Encoder encoder = load_fixture_encoder();
  Tensor ids = Tensor::zeros({1, 4}, DType::kI32), mask = Tensor::zeros({1, 4}, DType::kI32);
  Tensor out = Tensor::empty({1, 4, 32}, DType::kF32);
  ids.data_as<int32_t>()[2] = 64;
  EXPECT_THROW(encoder.forward(ExecContext{}, ids, mask, out), Error);  // id out of the vocabulary
  ids.data_as<int32_t>()[2] = 3;
  Tensor wrong_mask = Tensor::zeros({1, 5}, DType::kI32);
  EXPECT_THROW(encoder.forward(ExecContext{}, ids, wrong_mask, out), Error);
  Tensor wrong_out = Tensor::empty({1, 4, 31}, DType::kF32);
  EXPECT_THROW(encoder.forward(ExecContext{}, ids, mask, wrong_out), Error);
  EXPECT_THROW(parse_umt5_config(R"({"feed_forward_proj": "relu"})"), Error);
  EXPECT_THROW(UMT5Encoder(UMT5Config{}, {}), Error);  // missing tensors
}

}  // namespace
}  // namespace tessel
