// The Wan VAE encoder against diffusers' AutoencoderKLWan.encode: the tiny random models of
// tests/fixtures/diffusion/vae/ (Wan 2.1's layout) and vae_residual/ (Wan 2.2's residual, patched
// one), each with encode.safetensors (scripts/make_vae_encoder_fixture.py): a random video of 9
// frames and diffusers' float64 mu (the posterior's mode) and normalized latents of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "diffusion/diffusion_test_util.h"
#include "error_of.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/wan_vae.h"

namespace tessel {
namespace {

using tessel::testing::error_of;

const std::string kDir = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/diffusion/vae";
const std::string kResidualDir = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/diffusion/vae_residual";

Tensor poisoned(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::fill_n(t.data_as<float>(), t.numel(), std::numeric_limits<float>::quiet_NaN());
  return t;
}

double max_abs_difference(const float* a, const float* b, int64_t count) {
  double worst = 0.0;
  for (int64_t i = 0; i < count; ++i) worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

class WanVaeEncoder : public ::testing::TestWithParam<std::string> {};

TEST_P(WanVaeEncoder, EncodeMatchesDiffusers) {
  const WanVae vae = WanVae::load(GetParam());
  const SafetensorsFile io = SafetensorsFile::open(GetParam() + "/encode.safetensors");
  const Tensor video = io.load("video"), expected = io.load("mu");
  ASSERT_EQ(vae.encoded_shape(video.shape()), expected.shape());
  Tensor mu = poisoned(expected.shape());
  ASSERT_TRUE(vae.encode(ExecContext{}, video, mu));
  const double error = rel_l2(mu.data_as<float>(), expected.data_as<float>(), expected.numel());
  const double worst = max_abs_difference(mu.data_as<float>(), expected.data_as<float>(), expected.numel());
  std::printf("Wan VAE encode %s vs diffusers (float64): rel-L2 %.3g, max abs %.3g\n", shape_str(video.shape()).c_str(),
              error, worst);
  EXPECT_LE(error, 1e-4);
}

// Encoding is causal in time: the first frame alone (an image) encodes to the first latent frame,
// and five frames to the first two.
TEST_P(WanVaeEncoder, FewerFramesEncodeToTheLeadingLatentFrames) {
  const WanVae vae = WanVae::load(GetParam());
  const SafetensorsFile io = SafetensorsFile::open(GetParam() + "/encode.safetensors");
  const Tensor video = io.load("video"), expected = io.load("mu");
  for (int64_t kept : {1, 2}) {
    const Tensor mu = vae.encode(ExecContext{}, leading_frames(video, 4 * (kept - 1) + 1));
    const Tensor reference = leading_frames(expected, kept);
    ASSERT_EQ(mu.shape(), reference.shape());
    EXPECT_LE(rel_l2(mu.data_as<float>(), reference.data_as<float>(), reference.numel()), 1e-4) << kept << " latent frames";
  }
}

TEST_P(WanVaeEncoder, NormalizeLatentsMatchesThePipeline) {
  const WanVae vae = WanVae::load(GetParam());
  const SafetensorsFile io = SafetensorsFile::open(GetParam() + "/encode.safetensors");
  const Tensor mu = io.load("mu"), expected = io.load("latents");
  const Tensor latents = vae.normalize_latents(mu);
  ASSERT_EQ(latents.shape(), expected.shape());
  EXPECT_LE(max_abs_difference(latents.data_as<float>(), expected.data_as<float>(), expected.numel()), 1e-5);
}

// Each video of a batch is encoded on its own: the fixture's video twice gives its mu twice.
TEST_P(WanVaeEncoder, BatchEncodesEachVideo) {
  const WanVae vae = WanVae::load(GetParam());
  const SafetensorsFile io = SafetensorsFile::open(GetParam() + "/encode.safetensors");
  const Tensor video = leading_frames(io.load("video"), 5), expected = leading_frames(io.load("mu"), 2);
  Shape twice = video.shape();
  twice[0] = 2;
  Tensor batch = Tensor::empty(twice, DType::kF32);
  for (int64_t b = 0; b < 2; ++b)
    std::memcpy(batch.data_as<float>() + b * video.numel(), video.data_as<const float>(),
                static_cast<size_t>(video.numel()) * sizeof(float));
  const Tensor mu = vae.encode(ExecContext{}, batch);
  ASSERT_EQ(mu.shape(), (Shape{2, expected.size(1), 2, expected.size(3), expected.size(4)}));
  for (int64_t b = 0; b < 2; ++b)
    EXPECT_LE(rel_l2(mu.data_as<float>() + b * expected.numel(), expected.data_as<float>(), expected.numel()), 1e-4)
        << "video " << b;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, WanVaeEncoder, ::testing::Values(kDir, kResidualDir),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == kDir ? std::string("Wan21") : std::string("Wan22Residual");
                         });

// The decoder fixture's video (diffusers' decode of its latents, 9 frames of 40 x 56): its moments,
// the mean then the log-variance, were written by make_vae_fixture.py; the mean is what encode gives.
TEST(WanVaeEncoderDecodedVideo, MatchesDiffusersMoments) {
  const WanVae vae = WanVae::load(kDir);
  const SafetensorsFile io = SafetensorsFile::open(kDir + "/io.safetensors");
  const Tensor video = io.load("video"), moments = io.load("moments");
  const Tensor mu = vae.encode(ExecContext{}, video);
  ASSERT_EQ(mu.shape(), (Shape{1, 16, 3, 5, 7}));
  // The mean is the first 16 of the 32 channels, one contiguous run in (1, 32, T, h, w).
  const double error = rel_l2(mu.data_as<float>(), moments.data_as<float>(), mu.numel());
  std::printf("Wan VAE encode of the decoded video vs diffusers' moments: rel-L2 %.3g\n", error);
  EXPECT_LE(error, 1e-4);
}

TEST(WanVaeEncoderControl, ReportsChunksAndStopsWhenCancelled) {
  const WanVae vae = WanVae::load(kDir);
  const Tensor video = SafetensorsFile::open(kDir + "/encode.safetensors").load("video");
  std::vector<std::pair<int64_t, int64_t>> reported;
  std::atomic<bool> cancel{false};
  WanDecodeControl control;
  control.cancel = &cancel;
  control.on_chunk = [&](int64_t done, int64_t chunks) {
    reported.emplace_back(done, chunks);
    if (done == 2) cancel = true;
  };
  Tensor mu = poisoned(vae.encoded_shape(video.shape()));
  EXPECT_FALSE(vae.encode(ExecContext{}, video, mu, &control));
  EXPECT_EQ(reported, (std::vector<std::pair<int64_t, int64_t>>{{1, 3}, {2, 3}}));
  EXPECT_TRUE(vae.encode(ExecContext{}, video, nullptr).defined());
  EXPECT_FALSE(vae.encode(ExecContext{}, video, &control).defined());  // still cancelled: empty
}

TEST(WanVaeEncoderArguments, BadShapesAreErrorsNamingTheArgument) {
  const WanVae vae = WanVae::load(kDir);
  const ExecContext ctx;
  const std::string frames = error_of([&] { vae.encode(ctx, Tensor::zeros({1, 3, 4, 16, 16}, DType::kF32)); });
  EXPECT_NE(frames.find("video"), std::string::npos) << frames;
  EXPECT_NE(frames.find("1 + 4k frames"), std::string::npos) << frames;
  const std::string height = error_of([&] { vae.encode(ctx, Tensor::zeros({1, 3, 1, 20, 16}, DType::kF32)); });
  EXPECT_NE(height.find("multiples of 8"), std::string::npos) << height;
  const std::string channels = error_of([&] { vae.encode(ctx, Tensor::zeros({1, 4, 1, 16, 16}, DType::kF32)); });
  EXPECT_NE(channels.find("3 channels"), std::string::npos) << channels;
  const std::string half = error_of([&] { vae.encode(ctx, Tensor::zeros({1, 3, 1, 16, 16}, DType::kF16)); });
  EXPECT_NE(half.find("video"), std::string::npos) << half;
  const std::string image = error_of([&] { vae.encode(ctx, Tensor::zeros({3, 16, 16}, DType::kF32)); });
  EXPECT_NE(image.find("video"), std::string::npos) << image;
  // A mu of another shape is named with the expected one, and nothing is written.
  Tensor small = poisoned({1, 16, 1, 2, 2});
  const std::string mu = error_of([&] { vae.encode(ctx, Tensor::zeros({1, 3, 5, 16, 16}, DType::kF32), small); });
  EXPECT_NE(mu.find("mu"), std::string::npos) << mu;
  EXPECT_NE(mu.find("(1, 16, 2, 2, 2)"), std::string::npos) << mu;
  EXPECT_TRUE(std::isnan(small.data_as<float>()[0]));
  const std::string normalize = error_of([&] { vae.normalize_latents(Tensor::zeros({1, 8, 1, 2, 2}, DType::kF32)); });
  EXPECT_NE(normalize.find("mu"), std::string::npos) << normalize;
  EXPECT_NE(normalize.find("16 (z_dim)"), std::string::npos) << normalize;
  // Wan 2.2's VAE: 16 pixels per latent pixel (the patch included), 3 colours (its 12 channels).
  const WanVae residual = WanVae::load(kResidualDir);
  const std::string stride = error_of([&] { residual.encode(ctx, Tensor::zeros({1, 3, 1, 24, 32}, DType::kF32)); });
  EXPECT_NE(stride.find("multiples of 16"), std::string::npos) << stride;
  const std::string patched = error_of([&] { residual.encode(ctx, Tensor::zeros({1, 12, 1, 32, 32}, DType::kF32)); });
  EXPECT_NE(patched.find("3 channels"), std::string::npos) << patched;
}

// diffusers encodes chunks of 4 frames, which a third temporal downsampler would have to halve to
// half a frame (diffusers' convolution fails there): refused, naming the config key.
TEST(WanVaeEncoderArguments, ThreeTemporalStagesAreAnErrorNamingTheKey) {
  WanVaeConfig config = tiny_wan_vae_config();
  config.temporal_downsample.assign(config.temporal_downsample.size(), true);
  ASSERT_EQ(config.temporal_compression(), 8);
  const WanVae vae(config, random_model_weights(wan_vae_weight_specs(config), 3));
  const std::string error = error_of([&] { vae.encode(ExecContext{}, Tensor::zeros({1, 3, 9, 16, 16}, DType::kF32)); });
  EXPECT_NE(error.find("temperal_downsample"), std::string::npos) << error;
}

}  // namespace
}  // namespace tessel

namespace tessel {
namespace {

// A decoder-only VAE reads no encoder tensor, decodes as the whole one does, and refuses to encode.
TEST(WanVaeParts, ADecoderOnlyVaeDecodesTheSameAndRefusesToEncode) {
  const WanVae whole = WanVae::load(kDir);
  const WanVae decoder = WanVae::load(kDir, WanVaeParts::kDecoder);
  EXPECT_TRUE(whole.has_encoder());
  EXPECT_FALSE(decoder.has_encoder());
  Tensor latents = Tensor::empty({1, 16, 2, 3, 4}, DType::kF32);
  fill_normal(latents.view(), 7);
  const Tensor a = whole.decode(ExecContext{}, latents), b = decoder.decode(ExecContext{}, latents);
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  Tensor video = Tensor::zeros({1, 3, 1, 16, 16}, DType::kF32);
  const std::string error = error_of([&] { decoder.encode(ExecContext{}, video); });
  EXPECT_NE(error.find("encoder"), std::string::npos) << error;
}

}  // namespace
}  // namespace tessel
