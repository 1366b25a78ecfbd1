// The Wan VAE decoder against diffusers' AutoencoderKLWan (tests/fixtures/diffusion/vae/, written by
// scripts/make_vae_fixture.py): a tiny random model in the file layout of a pipeline's vae/ folder
// (three upsampling stages, two of them temporal, channel changes with shortcut convolutions) and
// its float64 decode of 3 latent frames of 5 x 7 into 9 frames of 40 x 56; and Wan 2.2's residual,
// patched VAE (tests/fixtures/diffusion/vae_residual/, scripts/make_residual_vae_fixture.py) decoding
// 3 latent frames of 2 x 3 into 9 frames of 32 x 48.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/wan_vae.h"
#include "diffusion/diffusion_test_util.h"

namespace tessel {
namespace {

const std::string kDir = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/diffusion/vae";
const std::string kResidualDir = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/diffusion/vae_residual";

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

Tensor poisoned(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::fill_n(t.data_as<float>(), t.numel(), std::numeric_limits<float>::quiet_NaN());
  return t;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// A copy of a fixture directory whose config.json is `edit` applied to the fixture's.
std::string edited_copy(const std::string& name, const std::function<void(nlohmann::json&)>& edit,
                        const std::string& fixture = kDir) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / (name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(fixture + "/diffusion_pytorch_model.safetensors", dir / "diffusion_pytorch_model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  nlohmann::json config = nlohmann::json::parse(read_text(fixture + "/config.json"));
  edit(config);
  std::ofstream(dir / "config.json") << config.dump();
  return dir.string();
}

TEST(WanVae, DecodeMatchesDiffusers) {
  const WanVae vae = WanVae::load(kDir);
  const SafetensorsFile io = SafetensorsFile::open(kDir + "/io.safetensors");
  const Tensor latents = io.load("latents"), expected = io.load("video");
  ASSERT_EQ(vae.decoded_shape(latents.shape()), expected.shape());
  Tensor video = poisoned(expected.shape());
  vae.decode(ExecContext{}, latents, video);
  const double error = rel_l2(video.data_as<float>(), expected.data_as<float>(), expected.numel());
  std::printf("Wan VAE decode rel-L2 vs diffusers (float64): %.3g\n", error);
  EXPECT_LE(error, 1e-4);
  for (int64_t i = 0; i < video.numel(); ++i) ASSERT_LE(std::abs(video.data_as<float>()[i]), 1.0f) << "at " << i;
}

// Decoding is causal in time: the first latent frame alone decodes to the first video frame, and
// two latent frames to the first five.
TEST(WanVae, DecodingFewerFramesGivesTheLeadingFrames) {
  const WanVae vae = WanVae::load(kDir);
  const SafetensorsFile io = SafetensorsFile::open(kDir + "/io.safetensors");
  const Tensor latents = io.load("latents"), expected = io.load("video");
  const int64_t z = 16, frames = 3, plane = 5 * 7, out_plane = 40 * 56;
  for (int64_t kept : {1, 2}) {
    Tensor head = Tensor::empty({1, z, kept, 5, 7}, DType::kF32);
    for (int64_t c = 0; c < z; ++c)
      std::memcpy(head.data_as<float>() + c * kept * plane, latents.data_as<float>() + c * frames * plane,
                  static_cast<size_t>(kept * plane) * sizeof(float));
    const Tensor video = vae.decode(ExecContext{}, head);
    const int64_t out_frames = 4 * (kept - 1) + 1;
    ASSERT_EQ(video.shape(), (Shape{1, 3, out_frames, 40, 56}));
    for (int64_t c = 0; c < 3; ++c)
      EXPECT_LE(rel_l2(video.data_as<float>() + c * out_frames * out_plane, expected.data_as<float>() + c * 9 * out_plane,
                       out_frames * out_plane),
                1e-4)
          << kept << " latent frames, channel " << c;
  }
}

TEST(WanVae, BadArgumentsAreErrorsNamingThem) {
  const WanVae vae = WanVae::load(kDir);
  Tensor video = poisoned({1, 3, 9, 40, 56});
  const Tensor wrong_channels = Tensor::zeros({1, 8, 3, 5, 7}, DType::kF32);
  EXPECT_NE(error_of([&] { vae.decode(ExecContext{}, wrong_channels, video); }).find("16 channels (z_dim)"), std::string::npos);
  const Tensor two_videos = Tensor::zeros({2, 16, 3, 5, 7}, DType::kF32);
  EXPECT_NE(error_of([&] { vae.decode(ExecContext{}, two_videos); }).find("batch 1"), std::string::npos);
  const Tensor latents = Tensor::zeros({1, 16, 3, 5, 7}, DType::kF32);
  Tensor small = poisoned({1, 3, 5, 40, 56});
  EXPECT_NE(error_of([&] { vae.decode(ExecContext{}, latents, small); }).find("(1, 3, 9, 40, 56)"), std::string::npos);
  EXPECT_TRUE(std::isnan(small.data_as<float>()[0]));  // nothing written
  const Tensor half = Tensor::zeros({1, 16, 3, 5, 7}, DType::kF16);
  EXPECT_NE(error_of([&] { vae.decode(ExecContext{}, half); }).find("latents"), std::string::npos);
}

TEST(WanVae, BadCheckpointsAreErrorsNamingTheTensor) {
  EXPECT_NE(error_of([] { WanVae::load(kDir + "/missing"); }).find("missing"), std::string::npos);
  // A config whose z_dim disagrees with the weights: the first tensor of another shape is named.
  const std::string z8 = edited_copy("vae_z8", [](nlohmann::json& c) {
    c["z_dim"] = 8;
    c["latents_mean"] = std::vector<double>(8, 0.0);
    c["latents_std"] = std::vector<double>(8, 1.0);
  });
  const std::string z8_error = error_of([&] { WanVae::load(z8); });
  EXPECT_NE(z8_error.find("encoder.conv_out.weight"), std::string::npos) << z8_error;
  // Weights built in memory: a missing tensor, a tensor of another shape, an extra tensor.
  const WanVaeConfig config = parse_wan_vae_config(read_text(kDir + "/config.json"));
  const SafetensorsFile file = SafetensorsFile::open(kDir + "/diffusion_pytorch_model.safetensors");
  std::map<std::string, Tensor> weights;
  for (const SafetensorsEntry& entry : file.entries()) weights[entry.name] = file.load(entry.name);
  auto missing = weights;
  missing.erase("decoder.up_blocks.1.upsamplers.0.time_conv.weight");
  EXPECT_NE(error_of([&] { WanVae(config, missing); }).find("decoder.up_blocks.1.upsamplers.0.time_conv.weight"),
            std::string::npos);
  auto reshaped = weights;
  reshaped["decoder.mid_block.attentions.0.to_qkv.weight"] = Tensor::zeros({72, 24}, DType::kF32);
  const std::string shape_error = error_of([&] { WanVae(config, reshaped); });
  EXPECT_NE(shape_error.find("to_qkv.weight"), std::string::npos) << shape_error;
  EXPECT_NE(shape_error.find("(72, 24, 1, 1)"), std::string::npos) << shape_error;
  auto extra = weights;
  extra["decoder.extra.weight"] = Tensor::zeros({1}, DType::kF32);
  EXPECT_NE(error_of([&] { WanVae(config, extra); }).find("decoder.extra.weight"), std::string::npos);
  // The same weights stored in bf16 load too (converted to fp32).
  auto bf16 = weights;
  for (auto& [name, tensor] : bf16) tensor = tensor.to(DType::kBF16);
  EXPECT_NO_THROW(WanVae(config, bf16));
}

TEST(WanVae, BadConfigsAreErrorsNamingTheKey) {
  const std::string text = read_text(kDir + "/config.json");
  const WanVaeConfig config = parse_wan_vae_config(text);
  EXPECT_EQ(config.base_dim, 8);
  EXPECT_EQ(config.decoder_base_dim, 8);
  EXPECT_EQ(config.dim_mult, (std::vector<int64_t>{1, 2, 3, 3}));
  EXPECT_FLOAT_EQ(config.latents_std[0], 0.5002f);
  const auto error_with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json json = nlohmann::json::parse(text);
    edit(json);
    return error_of([&] { parse_wan_vae_config(json.dump(), "vae/config.json"); });
  };
  const std::pair<std::function<void(nlohmann::json&)>, const char*> cases[] = {
      {[](nlohmann::json& c) { c["is_residual"] = "yes"; }, "is_residual"},
      {[](nlohmann::json& c) { c["patch_size"] = 0; }, "patch_size"},
      {[](nlohmann::json& c) { c["patch_size"] = 2; }, "in_channels"},  // 3 channels are no 2 x 2 patches
      {[](nlohmann::json& c) { c["clip_output"] = 1; }, "clip_output"},
      {[](nlohmann::json& c) { c["attn_scales"] = {0.5}; }, "attn_scales"},
      {[](nlohmann::json& c) { c["_class_name"] = "AutoencoderKL"; }, "_class_name"},
      {[](nlohmann::json& c) { c["latents_std"] = {1.0, 2.0}; }, "latents_std"},
      {[](nlohmann::json& c) { c["latents_std"][3] = 0.0; }, "latents_std"},
      {[](nlohmann::json& c) { c["temperal_downsample"] = {true}; }, "temperal_downsample"},
      {[](nlohmann::json& c) { c["z_dim"] = "16"; }, "z_dim"},
      {[](nlohmann::json& c) { c["base_dim"] = 0; }, "base_dim"},
      {[](nlohmann::json& c) { c["scale_factor_temporal"] = 8; }, "scale_factor_temporal"},
      {[](nlohmann::json& c) { c["dim_mult"] = {1}; }, "dim_mult"},
  };
  for (const auto& [edit, key] : cases) {
    const std::string message = error_with(edit);
    EXPECT_NE(message.find("vae/config.json"), std::string::npos) << message;
    EXPECT_NE(message.find(key), std::string::npos) << message;
  }
  EXPECT_NE(error_of([] { parse_wan_vae_config("[1, 2]"); }).find("JSON object"), std::string::npos);
}

TEST(WanResidualVae, DecodeMatchesDiffusers) {
  const WanVae vae = WanVae::load(kResidualDir);
  EXPECT_TRUE(vae.config().is_residual);
  EXPECT_EQ(vae.config().patch_size, 2);
  EXPECT_EQ(vae.config().spatial_compression(), 16);
  const SafetensorsFile io = SafetensorsFile::open(kResidualDir + "/io.safetensors");
  const Tensor latents = io.load("latents"), expected = io.load("video");
  ASSERT_EQ(vae.decoded_shape(latents.shape()), (Shape{1, 3, 9, 32, 48}));
  ASSERT_EQ(expected.shape(), (Shape{1, 3, 9, 32, 48}));
  Tensor video = poisoned(expected.shape());
  vae.decode(ExecContext{}, latents, video);
  const double error = rel_l2(video.data_as<float>(), expected.data_as<float>(), expected.numel());
  std::printf("Wan 2.2 residual VAE decode rel-L2 vs diffusers (float64): %.3g\n", error);
  EXPECT_LE(error, 1e-4);
  int64_t clamped = 0;
  for (int64_t i = 0; i < video.numel(); ++i) {
    ASSERT_LE(std::abs(video.data_as<float>()[i]), 1.0f) << "at " << i;
    clamped += std::abs(video.data_as<float>()[i]) == 1.0f;
  }
  EXPECT_GT(clamped, 0);  // the fixture reaches the clamp, so the comparison covers it
}

// The duplicate-upsample shortcut drops its doubled first frame only on the first chunk: decoding
// one and two latent frames gives the leading 1 and 5 frames of the three-frame decode.
TEST(WanResidualVae, DecodingFewerFramesGivesTheLeadingFrames) {
  const WanVae vae = WanVae::load(kResidualDir);
  const SafetensorsFile io = SafetensorsFile::open(kResidualDir + "/io.safetensors");
  const Tensor latents = io.load("latents"), expected = io.load("video");
  const int64_t z = 8, frames = 3, plane = 2 * 3, out_plane = 32 * 48;
  for (int64_t kept : {1, 2}) {
    Tensor head = Tensor::empty({1, z, kept, 2, 3}, DType::kF32);
    for (int64_t c = 0; c < z; ++c)
      std::memcpy(head.data_as<float>() + c * kept * plane, latents.data_as<float>() + c * frames * plane,
                  static_cast<size_t>(kept * plane) * sizeof(float));
    const Tensor video = vae.decode(ExecContext{}, head);
    const int64_t out_frames = 4 * (kept - 1) + 1;
    ASSERT_EQ(video.shape(), (Shape{1, 3, out_frames, 32, 48}));
    for (int64_t c = 0; c < 3; ++c)
      EXPECT_LE(rel_l2(video.data_as<float>() + c * out_frames * out_plane, expected.data_as<float>() + c * 9 * out_plane,
                       out_frames * out_plane),
                1e-4)
          << kept << " latent frames, channel " << c;
  }
}

TEST(WanResidualVae, ConfigRoundTripsAndNamesTheResidualTensors) {
  const WanVaeConfig config = parse_wan_vae_config(read_text(kResidualDir + "/config.json"));
  EXPECT_EQ(config.decoder_base_dim, 4);
  EXPECT_EQ(config.in_channels, 12);
  const WanVaeConfig again = parse_wan_vae_config(wan_vae_config_json(config));
  EXPECT_TRUE(again.is_residual);
  EXPECT_EQ(again.patch_size, 2);
  EXPECT_EQ(wan_vae_config_json(again), wan_vae_config_json(config));
  // Every tensor diffusers saved, and no other, by name and shape.
  const SafetensorsFile file = SafetensorsFile::open(kResidualDir + "/diffusion_pytorch_model.safetensors");
  const std::vector<WeightSpec> specs = wan_vae_weight_specs(config);
  EXPECT_EQ(specs.size(), file.entries().size());
  for (const WeightSpec& spec : specs) {
    const SafetensorsEntry* entry = file.find(spec.name);
    ASSERT_NE(entry, nullptr) << spec.name;
    EXPECT_EQ(entry->shape, spec.shape) << spec.name;
  }
  // A missing residual-layout tensor is named.
  std::map<std::string, Tensor> weights;
  for (const SafetensorsEntry& entry : file.entries()) weights[entry.name] = file.load(entry.name);
  EXPECT_NO_THROW(WanVae(config, weights));
  weights.erase("decoder.up_blocks.0.upsampler.time_conv.weight");
  const std::string missing_error = error_of([&] { WanVae(config, weights); });
  EXPECT_NE(missing_error.find("decoder.up_blocks.0.upsampler.time_conv.weight"), std::string::npos) << missing_error;
}

TEST(WanResidualVae, BadResidualConfigsAreErrorsNamingTheKey) {
  const std::string text = read_text(kResidualDir + "/config.json");
  const auto error_with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json json = nlohmann::json::parse(text);
    edit(json);
    return error_of([&] { parse_wan_vae_config(json.dump(), "vae/config.json"); });
  };
  const std::pair<std::function<void(nlohmann::json&)>, const char*> cases[] = {
      {[](nlohmann::json& c) { c["patch_size"] = 3; }, "in_channels"},      // 12 channels are no 3 x 3 patches
      {[](nlohmann::json& c) { c["out_channels"] = 6; }, "out_channels"},  // nor 6
      {[](nlohmann::json& c) { c["patch_size"] = 17; }, "patch_size"},
      {[](nlohmann::json& c) { c["patch_size"] = "2"; }, "patch_size"},
      {[](nlohmann::json& c) { c["is_residual"] = 1; }, "is_residual"},
      // decoder widths 12, 12, 12, 8, 4: DupUp3D cannot spread 12 channels over 8 x 4 values.
      {[](nlohmann::json& c) { c["dim_mult"] = {1, 2, 3, 3}; }, "dim_mult"},
      {[](nlohmann::json& c) { c["scale_factor_spatial"] = 8; }, "scale_factor_spatial"},  // 16 with the patch
      {[](nlohmann::json& c) { c["attn_scales"] = {1.0}; }, "attn_scales"},
  };
  for (const auto& [edit, key] : cases) {
    const std::string message = error_with(edit);
    EXPECT_NE(message.find("vae/config.json"), std::string::npos) << message;
    EXPECT_NE(message.find(key), std::string::npos) << key << ": " << message;
  }
  // Latents on a CUDA device go to the CUDA decoder, which checks the video against the patched
  // shape (16x the latent size) before any device work. Views that only claim the device reach that
  // check on a machine without a GPU: nothing is read through them.
  const WanVae vae = WanVae::load(kResidualDir);
  std::vector<float> latents(8 * 2 * 3), video(3 * 16 * 24);
  const TensorView device_latents(latents.data(), DType::kF32, Device::cuda(0), {1, 8, 1, 2, 3});
  const TensorView unpatched_video(video.data(), DType::kF32, Device::cuda(0), {1, 3, 1, 16, 24});
  const std::string device_error = error_of([&] { vae.decode(ExecContext{}, device_latents, unpatched_video); });
  EXPECT_NE(device_error.find("video"), std::string::npos) << device_error;
  EXPECT_NE(device_error.find("(1, 3, 1, 32, 48)"), std::string::npos) << device_error;
}

}  // namespace
}  // namespace tessel
