// The UMT5 text encoder against transformers' UMT5EncoderModel (tests/fixtures/diffusion/umt5/,
// written by scripts/make_umt5_fixture.py): a tiny random model with 8 relative-position buckets
// over a maximum distance of 16, so both the exact and the logarithmic buckets are used, and a
// batch whose second row is padded.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/umt5_encoder.h"

namespace tessel {
namespace {

const std::string kDir = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/diffusion/umt5";

UMT5Encoder load_fixture_encoder() {
  std::ifstream file(kDir + "/config.json");
  std::stringstream text;
  text << file.rdbuf();
  const UMT5Config config = parse_umt5_config(text.str());
  const SafetensorsFile weights_file = SafetensorsFile::open(kDir + "/model.safetensors");
  std::map<std::string, Tensor> weights;
  for (const SafetensorsEntry& entry : weights_file.entries()) weights[entry.name] = weights_file.load(entry.name);
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
