// The CLIP vision encoder's fp32 CUDA forward against transformers (the tests/fixtures/diffusion/
// clip_vision fixture: a tiny random CLIPVisionModel of 3 layers on a batch of 2, float64
// hidden_states[-2] with gelu and quick_gelu) and against the CPU forward on random weights of odd
// sizes: ViT-H's head dim 80, head dims 20 and 128 (the kernel's largest), token counts that end
// mid-tile (10 and 101: query tiles of 16, key tiles of 32), batches of 1 to 3. Skips without a GPU.
//
// Tolerance: both forwards are fp32 throughout (cuBLASLt without TF32, fp32 attention and
// LayerNorm), so they differ by summation order only: a few 1e-7 relative per operation. The CPU
// is held to 1e-5 against transformers' float64, and the CUDA forward to the same bound against
// both. A wrong head split, a missing bias, the wrong activation or a misplaced class token moves
// the features by tens of percent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>

#include "diffusion/diffusion_test_util.h"
#include "error_of.h"
#include "tessel/core/device.h"
#include "tessel/core/exec_context.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/clip_vision_encoder.h"
#include "tessel/diffusion/tiny_model.h"
#include "test_source_dir.h"

namespace tessel {
namespace {

using tessel::testing::error_of;

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

const std::string kDir = (test_support::source_dir() / "tests/fixtures/diffusion/clip_vision").string();

ClipVisionConfig fixture_config() {
  std::ifstream file(kDir + "/config.json");
  std::stringstream text;
  text << file.rdbuf();
  return parse_clip_vision_config(text.str());
}

// The fixture's weights under the names of clip_vision_weight_specs (transformers 5 saved them
// without the vision_model. prefix).
std::map<std::string, Tensor> fixture_weights() {
  const SafetensorsFile file = SafetensorsFile::open(kDir + "/model.safetensors");
  std::map<std::string, Tensor> weights;
  for (const SafetensorsEntry& entry : file.entries()) weights["vision_model." + entry.name] = file.load(entry.name);
  return weights;
}

// The features of `pixels` in an output filled with NaN first, so any value not written shows.
Tensor encode(const ClipVisionEncoder& encoder, const Tensor& pixels, const ExecContext& ctx = ExecContext{}) {
  Tensor out = Tensor::empty({pixels.size(0), encoder.config().tokens(), encoder.config().hidden_size}, DType::kF32);
  std::fill_n(out.data_as<float>(), out.numel(), std::numeric_limits<float>::quiet_NaN());
  encoder.forward(ctx, pixels, out);
  return out;
}

void expect_finite(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) ASSERT_TRUE(std::isfinite(t.data_as<float>()[i])) << "at " << i;
}

TEST(ClipVisionEncoderGpu, MatchesTransformersAndTheCpu) {
  SKIP_WITHOUT_GPU();
  const SafetensorsFile io = SafetensorsFile::open(kDir + "/io.safetensors");
  const Tensor pixels = io.load("pixel_values");
  for (const auto& [act, name] : {std::pair{ClipActivation::gelu, "hidden_states"},
                                  std::pair{ClipActivation::quick_gelu, "hidden_states_quick_gelu"}}) {
    ClipVisionConfig config = fixture_config();
    config.hidden_act = act;
    const ClipVisionEncoder gpu_encoder(config, fixture_weights(), Device::cuda());
    EXPECT_TRUE(gpu_encoder.device().is_cuda());
    const Tensor expected = io.load(name);
    const Tensor gpu = encode(gpu_encoder, pixels);
    ASSERT_EQ(gpu.shape(), expected.shape());
    expect_finite(gpu);
    const Tensor cpu = encode(ClipVisionEncoder(config, fixture_weights()), pixels);
    const double vs_transformers = rel_l2(gpu.data_as<float>(), expected.data_as<float>(), expected.numel());
    const double vs_cpu = rel_l2(gpu.data_as<float>(), cpu.data_as<float>(), cpu.numel());
    std::printf("CLIP vision CUDA %s rel-L2: %.3g vs transformers float64, %.3g vs the CPU\n", name, vs_transformers, vs_cpu);
    EXPECT_LE(vs_transformers, 1e-5) << name;
    EXPECT_LE(vs_cpu, 1e-5) << name;
  }
}

// load() on a device gives what the constructor on that device gives, bit for bit, also on the
// stream of a context of that device.
TEST(ClipVisionEncoderGpu, LoadsOnTheDeviceAndRunsOnTheContextsStream) {
  SKIP_WITHOUT_GPU();
  const Tensor pixels = SafetensorsFile::open(kDir + "/io.safetensors").load("pixel_values");
  const Tensor built = encode(ClipVisionEncoder(fixture_config(), fixture_weights(), Device::cuda()), pixels);
  const ClipVisionEncoder loaded = ClipVisionEncoder::load(kDir, Device::cuda());
  EXPECT_TRUE(loaded.device().is_cuda());
  EXPECT_EQ(std::memcmp(built.data(), encode(loaded, pixels).data(), built.nbytes()), 0);
  ExecContext ctx;
  ctx.device = Device::cuda();
  EXPECT_EQ(std::memcmp(built.data(), encode(loaded, pixels, ctx).data(), built.nbytes()), 0);
}

struct RandomCase {
  int64_t hidden, heads, intermediate, layers, image_size, patch, batch;
  ClipActivation act;
};

TEST(ClipVisionEncoderGpu, RandomWeightsAtOddSizesMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const RandomCase cases[] = {
      {160, 2, 200, 3, 42, 14, 1, ClipActivation::gelu},        // head dim 80 (ViT-H's), 10 tokens
      {160, 2, 200, 3, 70, 7, 3, ClipActivation::quick_gelu},   // head dim 80, 101 tokens: partial tiles
      {60, 3, 90, 4, 70, 7, 2, ClipActivation::gelu},           // head dim 20, 4 layers (3 computed)
      {256, 2, 130, 2, 28, 7, 2, ClipActivation::quick_gelu},   // head dim 128, 17 tokens, one layer computed
  };
  uint64_t seed = 61;
  for (const RandomCase& c : cases) {
    ClipVisionConfig config;
    config.hidden_size = c.hidden, config.num_attention_heads = c.heads, config.intermediate_size = c.intermediate;
    config.num_hidden_layers = c.layers, config.image_size = c.image_size, config.patch_size = c.patch, config.hidden_act = c.act;
    const std::map<std::string, Tensor> weights = random_model_weights(clip_vision_weight_specs(config), seed++);
    Tensor pixels = Tensor::empty({c.batch, 3, c.image_size, c.image_size}, DType::kF32);
    fill_normal(pixels.view(), seed++);
    const Tensor cpu = encode(ClipVisionEncoder(config, weights), pixels);
    const Tensor gpu = encode(ClipVisionEncoder(config, weights, Device::cuda()), pixels);
    expect_finite(gpu);
    const double error = rel_l2(gpu.data_as<float>(), cpu.data_as<float>(), cpu.numel());
    std::printf("CLIP vision hidden %lld, %lld heads, %lld tokens, batch %lld: CUDA vs CPU rel-L2 %.3g\n",
                static_cast<long long>(c.hidden), static_cast<long long>(c.heads), static_cast<long long>(config.tokens()),
                static_cast<long long>(c.batch), error);
    EXPECT_LE(error, 1e-5) << "hidden " << c.hidden << ", heads " << c.heads << ", tokens " << config.tokens();
  }
}

TEST(ClipVisionEncoderGpu, BadInputsAndHeadDimsPastTheKernelAreErrors) {
  SKIP_WITHOUT_GPU();
  const ClipVisionEncoder encoder(fixture_config(), fixture_weights(), Device::cuda());
  Tensor out = Tensor::empty({1, 10, 32}, DType::kF32);
  const Tensor device_pixels = Tensor::zeros({1, 3, 42, 42}, DType::kF32, Device::cuda());
  EXPECT_NE(error_of([&] { encoder.forward(ExecContext{}, device_pixels, out); }).find("pixel_values"), std::string::npos);
  const Tensor pixels = Tensor::zeros({1, 3, 42, 42}, DType::kF32);
  Tensor device_out = Tensor::empty({1, 10, 32}, DType::kF32, Device::cuda());
  EXPECT_NE(error_of([&] { encoder.forward(ExecContext{}, pixels, device_out); }).find("out"), std::string::npos);

  ClipVisionConfig wide;
  wide.hidden_size = 264, wide.num_attention_heads = 2, wide.intermediate_size = 8, wide.num_hidden_layers = 2;
  wide.image_size = 14, wide.patch_size = 14;
  const std::map<std::string, Tensor> wide_weights = random_model_weights(clip_vision_weight_specs(wide), 3);
  const std::string error = error_of([&] { ClipVisionEncoder(wide, wide_weights, Device::cuda()); });
  EXPECT_NE(error.find("head dim"), std::string::npos) << error;
  EXPECT_NE(error.find("132"), std::string::npos) << error;
}

}  // namespace
}  // namespace tessel
