// The CLIP vision encoder and its preprocessing against transformers (tests/fixtures/diffusion/
// clip_vision/, written by scripts/make_clip_vision_fixture.py): a tiny random CLIPVisionModel of
// 3 layers (so hidden_states[-2] skips one) on a batch of 2, and CLIPImageProcessor's PIL backend on
// an image it upscales, one it downscales by less than 2 and one by more than 3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "diffusion/diffusion_test_util.h"
#include "error_of.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/clip_image_processor.h"
#include "tessel/diffusion/pil_resize.h"
#include "tessel/diffusion/clip_vision_encoder.h"

namespace tessel {
namespace {

using testing::error_of;

const std::string kDir = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/diffusion/clip_vision";

std::string fixture_config_text() {
  std::ifstream file(kDir + "/config.json");
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// The fixture's weights under the names of clip_vision_weight_specs (transformers 5 saved them
// without the vision_model. prefix).
std::map<std::string, Tensor> fixture_weights() {
  const SafetensorsFile file = SafetensorsFile::open(kDir + "/model.safetensors");
  std::map<std::string, Tensor> weights;
  for (const SafetensorsEntry& entry : file.entries()) weights["vision_model." + entry.name] = file.load(entry.name);
  return weights;
}

Tensor encode(const ClipVisionEncoder& encoder, const Tensor& pixels) {
  Tensor out = Tensor::empty({pixels.size(0), encoder.config().tokens(), encoder.config().hidden_size}, DType::kF32);
  encoder.forward(ExecContext{}, pixels, out);
  return out;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double most = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i)
    most = std::max(most, std::abs(static_cast<double>(a.data_as<float>()[i]) - b.data_as<float>()[i]));
  return most;
}

TEST(ClipVisionEncoder, MatchesTransformersPenultimateHiddenStates) {
  const ClipVisionConfig config = parse_clip_vision_config(fixture_config_text());
  EXPECT_EQ(config.hidden_act, ClipActivation::gelu);
  EXPECT_EQ(config.tokens(), 10);
  const SafetensorsFile io = SafetensorsFile::open(kDir + "/io.safetensors");
  const Tensor pixels = io.load("pixel_values");
  for (const auto& [act, name] : {std::pair{ClipActivation::gelu, "hidden_states"},
                                  std::pair{ClipActivation::quick_gelu, "hidden_states_quick_gelu"}}) {
    ClipVisionConfig with_act = config;
    with_act.hidden_act = act;
    const Tensor expected = io.load(name);
    const Tensor out = encode(ClipVisionEncoder(with_act, fixture_weights()), pixels);
    ASSERT_EQ(out.shape(), expected.shape());
    const double error = rel_l2(out.data_as<float>(), expected.data_as<float>(), out.numel());
    std::printf("CLIP vision %s rel-L2 vs transformers float64: %.3g (max abs %.3g)\n", name, error,
                max_abs_diff(out, expected));
    EXPECT_LE(error, 1e-5) << name;
  }
}

TEST(ClipVisionEncoder, LoadsATransformersDirectory) {
  const SafetensorsFile io = SafetensorsFile::open(kDir + "/io.safetensors");
  const Tensor pixels = io.load("pixel_values");
  const Tensor built = encode(ClipVisionEncoder(parse_clip_vision_config(fixture_config_text()), fixture_weights()), pixels);
  const Tensor loaded = encode(ClipVisionEncoder::load(kDir), pixels);
  EXPECT_EQ(std::memcmp(built.data(), loaded.data(), built.nbytes()), 0);

  // The names of transformers before version 5 (Wan's checkpoints), fp16, with the position_ids
  // buffer older versions saved.
  const std::filesystem::path old = std::filesystem::path(::testing::TempDir()) / ("clip_vision_" + std::to_string(::getpid()));
  std::filesystem::create_directories(old);
  std::filesystem::copy_file(kDir + "/config.json", old / "config.json", std::filesystem::copy_options::overwrite_existing);
  std::vector<Tensor> tensors;
  std::vector<std::pair<std::string, TensorView>> named;
  for (const auto& [name, tensor] : fixture_weights()) {
    tensors.push_back(tensor.to(DType::kF16));
    named.push_back({name, tensors.back().view()});
  }
  Tensor position_ids = Tensor::zeros({1, 10}, DType::kI32);
  named.push_back({"vision_model.embeddings.position_ids", position_ids.view()});
  write_safetensors((old / "model.safetensors").string(), named);
  const Tensor from_fp16 = encode(ClipVisionEncoder::load(old.string()), pixels);
  EXPECT_LE(rel_l2(from_fp16.data_as<float>(), built.data_as<float>(), built.numel()), 1e-2);
  std::filesystem::remove_all(old);

  EXPECT_NE(error_of([] { ClipVisionEncoder::load(kDir + "/missing"); }).find("missing/config.json"), std::string::npos);
}

TEST(ClipVisionEncoder, BadConfigWeightsAndInputsAreErrors) {
  EXPECT_NE(error_of([] { parse_clip_vision_config(R"({"hidden_act": "relu"})"); }).find("hidden_act"), std::string::npos);
  EXPECT_NE(error_of([] { parse_clip_vision_config(R"({"hidden_size": "big"})"); }).find("hidden_size"), std::string::npos);
  EXPECT_NE(error_of([] { parse_clip_vision_config(R"({"image_size": 40, "patch_size": 14})"); }).find("image_size"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_clip_vision_config(R"({"hidden_size": 30, "num_attention_heads": 4})"); }).find("hidden_size"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_clip_vision_config(R"({"vision_config": {"layer_norm_eps": 0}})"); })
                .find("vision_config: layer_norm_eps"),
            std::string::npos);
  // A CLIPModel's config: the vision tower's fields, transformers' defaults for the rest.
  const ClipVisionConfig nested = parse_clip_vision_config(R"({"vision_config": {"hidden_size": 1280, "num_attention_heads": 16, "patch_size": 14}})");
  EXPECT_EQ(nested.hidden_size, 1280);
  EXPECT_EQ(nested.tokens(), 257);
  EXPECT_EQ(nested.hidden_act, ClipActivation::quick_gelu);

  const ClipVisionConfig config = parse_clip_vision_config(fixture_config_text());
  std::map<std::string, Tensor> weights = fixture_weights();
  weights.erase("vision_model.encoder.layers.2.mlp.fc2.bias");  // the last layer's: unused, still required
  EXPECT_NE(error_of([&] { ClipVisionEncoder(config, weights); }).find("vision_model.encoder.layers.2.mlp.fc2.bias"),
            std::string::npos);
  weights = fixture_weights();
  weights["vision_model.pre_layrnorm.bias"] = Tensor::zeros({31}, DType::kF32);
  EXPECT_NE(error_of([&] { ClipVisionEncoder(config, weights); }).find("vision_model.pre_layrnorm.bias"), std::string::npos);
  weights = fixture_weights();
  weights["vision_model.extra"] = Tensor::zeros({1}, DType::kF32);
  EXPECT_NE(error_of([&] { ClipVisionEncoder(config, weights); }).find("vision_model.extra"), std::string::npos);

  const ClipVisionEncoder encoder(config, fixture_weights());
  Tensor out = Tensor::empty({1, 10, 32}, DType::kF32);
  const Tensor wrong_size = Tensor::zeros({1, 3, 28, 28}, DType::kF32);
  EXPECT_NE(error_of([&] { encoder.forward(ExecContext{}, wrong_size, out); }).find("pixel_values"), std::string::npos);
  const Tensor wrong_dtype = Tensor::zeros({1, 3, 42, 42}, DType::kF16);
  EXPECT_NE(error_of([&] { encoder.forward(ExecContext{}, wrong_dtype, out); }).find("pixel_values"), std::string::npos);
  const Tensor pixels = Tensor::zeros({2, 3, 42, 42}, DType::kF32);
  EXPECT_NE(error_of([&] { encoder.forward(ExecContext{}, pixels, out); }).find("out"), std::string::npos);  // batch 1
}

// The fixture image `name` as one RGB frame.
VideoFrames fixture_image(const SafetensorsFile& io, const std::string& name) {
  const Tensor image = io.load("image_" + name);
  VideoFrames frames;
  frames.count = 1;
  frames.height = image.size(0);
  frames.width = image.size(1);
  frames.rgb.assign(image.data_as<uint8_t>(), image.data_as<uint8_t>() + image.numel());
  return frames;
}

TEST(ClipImageProcessor, MatchesTransformersPilBackend) {
  const SafetensorsFile io = SafetensorsFile::open(kDir + "/io.safetensors");
  ClipImageProcessing processing;
  processing.shortest_edge = processing.crop_height = processing.crop_width = 42;
  for (const char* name : {"upscaled", "downscaled", "wide"}) {
    const Tensor expected = io.load(std::string("pixels_") + name);
    const Tensor out = clip_preprocess(fixture_image(io, name), processing);
    ASSERT_EQ(out.shape(), expected.shape()) << name;
    // In pixel levels: a level is 1 / (255 std) after normalization, about 0.015.
    const double levels = max_abs_diff(out, expected) * 255.0 * 0.2613;
    std::printf("CLIP preprocessing %s: max error %.3g pixel levels\n", name, levels);
    EXPECT_LE(levels, 1e-3) << name;  // PIL's integer arithmetic reproduced: the same bytes
  }
}

TEST(ClipImageProcessor, SizesAndBatches) {
  EXPECT_EQ(clip_resized_size(480, 832, 224), (std::pair<int64_t, int64_t>{224, 388}));
  EXPECT_EQ(clip_resized_size(832, 480, 224), (std::pair<int64_t, int64_t>{388, 224}));
  EXPECT_EQ(clip_resized_size(100, 100, 224), (std::pair<int64_t, int64_t>{224, 224}));
  // An unchanged size is the identity, as in Pillow.
  const std::vector<uint8_t> pixels = {1, 2, 3, 250, 251, 252, 7, 8, 9, 100, 0, 255};
  EXPECT_EQ(resize_pil(pixels.data(), 2, 2, 2, 2, PilFilter::kBicubic), pixels);

  // Two frames are preprocessed as two images.
  const SafetensorsFile io = SafetensorsFile::open(kDir + "/io.safetensors");
  VideoFrames two = fixture_image(io, "downscaled");
  two.rgb.insert(two.rgb.end(), two.rgb.rbegin(), two.rgb.rend());
  two.count = 2;
  ClipImageProcessing processing;
  processing.shortest_edge = 42;
  processing.crop_height = 42;
  processing.crop_width = 30;
  const Tensor out = clip_preprocess(two, processing);
  EXPECT_EQ(out.shape(), (Shape{2, 3, 42, 30}));
  const Tensor first = clip_preprocess(fixture_image(io, "downscaled"), processing);
  EXPECT_EQ(std::memcmp(out.data(), first.data(), first.nbytes()), 0);
  EXPECT_NE(std::memcmp(out.data_as<float>() + first.numel(), first.data(), first.nbytes()), 0);
}

TEST(ClipImageProcessor, BadImagesAndSettingsAreErrors) {
  VideoFrames empty;
  EXPECT_NE(error_of([&] { clip_preprocess(empty); }).find("images"), std::string::npos);
  VideoFrames short_rgb;
  short_rgb.count = 1;
  short_rgb.height = 4;
  short_rgb.width = 4;
  short_rgb.rgb.resize(47);
  EXPECT_NE(error_of([&] { clip_preprocess(short_rgb); }).find("images"), std::string::npos);
  short_rgb.rgb.resize(48);
  ClipImageProcessing processing;
  processing.crop_height = 300;
  EXPECT_NE(error_of([&] { clip_preprocess(short_rgb, processing); }).find("crop_height"), std::string::npos);
  processing = {};
  processing.image_std[1] = 0.0f;
  EXPECT_NE(error_of([&] { clip_preprocess(short_rgb, processing); }).find("image_std"), std::string::npos);
  processing = {};
  processing.shortest_edge = 0;
  EXPECT_NE(error_of([&] { clip_preprocess(short_rgb, processing); }).find("shortest_edge"), std::string::npos);
}

}  // namespace
}  // namespace tessel
