// The Wan VAE encoder on CUDA against diffusers' AutoencoderKLWan.encode (the fixtures of
// wan_vae_encoder_test.cc: encode.safetensors beside the tiny random Wan 2.1 VAE and Wan 2.2's
// residual, patched one, a video of 9 frames and diffusers' float64 mu) and against the CPU encoder
// on random weights, videos of odd latent sizes and 1 to 13 frames; and the image condition built on
// a CUDA context against the CPU's. Skips without a GPU.
//
// Tolerances, as the CUDA decoder's test reasons. With TF32 off every product is fp32, as on the
// CPU, but cuDNN may pick Winograd or FFT algorithms that round differently from a direct sum: held
// to the CPU encoder's own bound against float64 diffusers (1e-4; the CPU measures 7e-7 and 1e-6),
// against diffusers and against the CPU encode. With TF32 on (the default, as PyTorch) each
// convolution rounds its operands to 10 mantissa bits: some 1e-3 relative over the encoder's
// dozen convolutions in sequence, bounded by 1e-2. A wrong cache step, pad side, frame pairing or
// channel group moves mu by far more (a whole latent frame wrong is a rel-L2 of order 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "diffusion/diffusion_test_util.h"
#include "error_of.h"
#include "tessel/core/device.h"
#include "tessel/core/exec_context.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/log.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/wan_image_condition.h"
#include "tessel/diffusion/wan_vae.h"
#include "test_source_dir.h"

namespace tessel {
namespace {

using tessel::testing::error_of;

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

// The checkout's fixture, also when the binary was built elsewhere (TESSEL_SOURCE_DIR in the environment).
const std::string kDir = (test_support::source_dir() / "tests/fixtures/diffusion/vae").string();
const std::string kResidualDir = (test_support::source_dir() / "tests/fixtures/diffusion/vae_residual").string();

ExecContext cuda_context() {
  ExecContext ctx;
  ctx.device = Device::cuda();
  return ctx;
}

// A CUDA context whose warnings land in `warnings` (a CPU fallback of the encode warns).
ExecContext recording_cuda_context(std::vector<std::string>& warnings) {
  ExecContext ctx = cuda_context();
  ctx.log_sink = [&warnings](LogLevel level, std::string_view message) {
    if (level >= LogLevel::kWarning) warnings.emplace_back(message);
  };
  return ctx;
}

// A device tensor of `shape` filled with NaN, so any value the encode does not write shows.
Tensor poisoned_on_device(const Shape& shape) {
  Tensor host = Tensor::empty(shape, DType::kF32);
  std::fill_n(host.data_as<float>(), host.numel(), std::numeric_limits<float>::quiet_NaN());
  return host.to(Device::cuda());
}

// Encodes a host video on the GPU into a poisoned device mu and returns mu on the host.
Tensor encode_on_gpu(const WanVae& vae, const Tensor& video, const WanDecodeControl* control = nullptr) {
  const Tensor device_video = video.to(Device::cuda());
  Tensor mu = poisoned_on_device(vae.encoded_shape(video.shape()));
  EXPECT_TRUE(vae.encode(cuda_context(), device_video, mu, control));
  return mu.to(Device::cpu());
}

void expect_finite(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) ASSERT_TRUE(std::isfinite(t.data_as<float>()[i])) << "at " << i;
}

class WanVaeEncoderGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(WanVaeEncoderGpu, EncodeMatchesDiffusersAndTheCpuInFp32) {
  SKIP_WITHOUT_GPU();
  WanVae vae = WanVae::load(GetParam());
  vae.set_cuda_tf32(false);
  const SafetensorsFile io = SafetensorsFile::open(GetParam() + "/encode.safetensors");
  const Tensor video = io.load("video"), expected = io.load("mu");
  const Tensor mu = encode_on_gpu(vae, video);
  ASSERT_EQ(mu.shape(), expected.shape());
  expect_finite(mu);
  const double vs_diffusers = rel_l2(mu.data_as<float>(), expected.data_as<float>(), expected.numel());
  const Tensor cpu = vae.encode(ExecContext{}, video);
  const double vs_cpu = rel_l2(mu.data_as<float>(), cpu.data_as<float>(), cpu.numel());
  std::printf("Wan VAE CUDA encode %s (fp32) rel-L2: %.3g vs diffusers float64, %.3g vs the CPU encode\n", shape_str(video.shape()).c_str(),
              vs_diffusers, vs_cpu);
  EXPECT_LE(vs_diffusers, 1e-4);
  EXPECT_LE(vs_cpu, 1e-4);
}

TEST_P(WanVaeEncoderGpu, EncodeWithTf32MatchesDiffusers) {
  SKIP_WITHOUT_GPU();
  const WanVae vae = WanVae::load(GetParam());  // TF32 allowed: the default
  const SafetensorsFile io = SafetensorsFile::open(GetParam() + "/encode.safetensors");
  const Tensor video = io.load("video"), expected = io.load("mu");
  const Tensor mu = encode_on_gpu(vae, video);
  expect_finite(mu);
  const double error = rel_l2(mu.data_as<float>(), expected.data_as<float>(), expected.numel());
  std::printf("Wan VAE CUDA encode (TF32 convolutions) rel-L2 vs diffusers float64: %.3g\n", error);
  EXPECT_LE(error, 1e-2);
}

// Causal in time on the device too: the first frame alone encodes to the first latent frame and
// five frames to the first two; an encode after encodes of other sizes gives what it gave before
// (weights and plans reused, buffers given back in between).
TEST_P(WanVaeEncoderGpu, FewerFramesGiveTheLeadingLatentFramesAndReencodingIsIdentical) {
  SKIP_WITHOUT_GPU();
  WanVae vae = WanVae::load(GetParam());
  vae.set_cuda_tf32(false);
  const SafetensorsFile io = SafetensorsFile::open(GetParam() + "/encode.safetensors");
  const Tensor video = io.load("video"), expected = io.load("mu");
  const Tensor first = encode_on_gpu(vae, video);
  for (int64_t kept : {1, 2}) {
    const Tensor mu = encode_on_gpu(vae, leading_frames(video, 4 * (kept - 1) + 1));
    const Tensor reference = leading_frames(expected, kept);
    ASSERT_EQ(mu.shape(), reference.shape());
    EXPECT_LE(rel_l2(mu.data_as<float>(), reference.data_as<float>(), reference.numel()), 1e-4) << kept << " latent frames";
  }
  const Tensor again = encode_on_gpu(vae, video);
  EXPECT_EQ(std::memcmp(first.data(), again.data(), first.nbytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, WanVaeEncoderGpu, ::testing::Values(kDir, kResidualDir),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == kDir ? std::string("Wan21") : std::string("Wan22Residual");
                         });

// Random weights of a tiny VAE, seeded random videos of the given shapes: CUDA (fp32) against the
// CPU encoder.
void expect_random_videos_match_the_cpu(const WanVaeConfig& config, const std::vector<Shape>& shapes, uint64_t seed) {
  WanVae vae(config, random_model_weights(wan_vae_weight_specs(config), seed++));
  vae.set_cuda_tf32(false);
  for (const Shape& shape : shapes) {
    Tensor video = Tensor::empty(shape, DType::kF32);
    fill_normal(video.view(), seed++, 0.0, 0.5);
    const Tensor cpu = vae.encode(ExecContext{}, video);
    const Tensor gpu = encode_on_gpu(vae, video);
    ASSERT_EQ(gpu.shape(), cpu.shape());
    expect_finite(gpu);
    const double error = rel_l2(gpu.data_as<float>(), cpu.data_as<float>(), cpu.numel());
    std::printf("video %s -> mu %s: CUDA vs CPU rel-L2 %.3g\n", shape_str(shape).c_str(), shape_str(gpu.shape()).c_str(), error);
    EXPECT_LE(error, 1e-4) << shape_str(shape);
  }
}

// Wan 2.1's layout (8 pixels per latent pixel): latents of 3 x 5, 1 x 7, 5 x 1 and 1 x 1 from 1,
// 9, 13 and 5 frames, and a batch of two videos.
TEST(WanVaeEncoderGpuRandom, Wan21AtOddSizesMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_random_videos_match_the_cpu(tiny_wan_vae_config(),
                                     {{1, 3, 1, 24, 40}, {1, 3, 9, 8, 56}, {1, 3, 13, 40, 8}, {1, 3, 5, 8, 8}, {2, 3, 9, 24, 16}}, 31);
}

// Wan 2.2's residual, patched layout (16 pixels per latent pixel, AvgDown3D shortcuts, 48 latent
// channels): latents of 1 x 3, 3 x 1, 2 x 5 and 1 x 1 from 1, 9, 5 and 13 frames, and a batch of two.
TEST(WanVaeEncoderGpuRandom, Wan22ResidualAtOddSizesMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const WanVaeConfig config = tiny_ti2v_wan_vae_config();
  ASSERT_TRUE(config.is_residual);
  ASSERT_EQ(config.patch_size, 2);
  expect_random_videos_match_the_cpu(config,
                                     {{1, 3, 1, 16, 48}, {1, 3, 9, 48, 16}, {1, 3, 5, 32, 80}, {1, 3, 13, 16, 16}, {2, 3, 5, 16, 32}},
                                     47);
}

// Progress per chunk (each waited for) and a cancel between chunks, as on the CPU.
TEST(WanVaeEncoderGpuControl, ReportsChunksAndStopsWhenCancelled) {
  SKIP_WITHOUT_GPU();
  const WanVae vae = WanVae::load(kDir);
  const Tensor video = SafetensorsFile::open(kDir + "/encode.safetensors").load("video").to(Device::cuda());
  std::vector<std::pair<int64_t, int64_t>> reported;
  std::atomic<bool> cancel{false};
  WanDecodeControl control;
  control.cancel = &cancel;
  control.on_chunk = [&](int64_t done, int64_t chunks) {
    reported.emplace_back(done, chunks);
    if (done == 2) cancel = true;
  };
  Tensor mu = poisoned_on_device(vae.encoded_shape(video.shape()));
  EXPECT_FALSE(vae.encode(cuda_context(), video, mu, &control));
  EXPECT_EQ(reported, (std::vector<std::pair<int64_t, int64_t>>{{1, 3}, {2, 3}}));
  EXPECT_FALSE(vae.encode(cuda_context(), video, &control).defined());  // still cancelled: empty
  const Tensor whole = vae.encode(cuda_context(), video);
  ASSERT_TRUE(whole.defined());
  EXPECT_TRUE(whole.device().is_cuda());
}

TEST(WanVaeEncoderGpuArguments, MismatchedDevicesAreErrorsNamingTheArgument) {
  SKIP_WITHOUT_GPU();
  const WanVae vae = WanVae::load(kDir);
  const Tensor host_video = Tensor::zeros({1, 3, 5, 16, 16}, DType::kF32);
  const Tensor device_video = host_video.to(Device::cuda());
  Tensor host_mu = Tensor::empty({1, 16, 2, 2, 2}, DType::kF32);
  const std::string host_out = error_of([&] { vae.encode(cuda_context(), device_video, host_mu); });
  EXPECT_NE(host_out.find("mu"), std::string::npos) << host_out;
  const std::string host_in = error_of([&] { vae.encode(cuda_context(), host_video); });
  EXPECT_NE(host_in.find("video"), std::string::npos) << host_in;
  Tensor short_mu = poisoned_on_device({1, 16, 1, 2, 2});
  const std::string shape = error_of([&] { vae.encode(cuda_context(), device_video, short_mu); });
  EXPECT_NE(shape.find("(1, 16, 2, 2, 2)"), std::string::npos) << shape;
  const WanVae decoder_only = WanVae::load(kDir, WanVaeParts::kDecoder);
  const std::string no_encoder = error_of([&] { decoder_only.encode(cuda_context(), device_video); });
  EXPECT_NE(no_encoder.find("encoder"), std::string::npos) << no_encoder;
}

// The image condition (I2V and FLF2V) and TI2V's first-frame latents on a CUDA context: host
// tensors equal to the CPU's within the encoder's bound (the mask part exactly), encoded on the
// device (no warning of a CPU fallback).
TEST(WanImageConditionGpu, ACudaContextEncodesOnTheDeviceAsTheCpuDoes) {
  SKIP_WITHOUT_GPU();
  WanVae vae = WanVae::load(kDir);
  vae.set_cuda_tf32(false);
  Tensor first = Tensor::empty({1, 3, 24, 40}, DType::kF32), last = Tensor::empty({1, 3, 24, 40}, DType::kF32);
  fill_normal(first.view(), 5, 0.0, 0.5);
  fill_normal(last.view(), 6, 0.0, 0.5);
  std::vector<std::string> warnings;
  const ExecContext ctx = recording_cuda_context(warnings);
  for (const bool with_last : {false, true}) {
    const Tensor end = with_last ? last : Tensor{};
    const Tensor cpu = wan_image_condition(ExecContext{}, vae, first, end, 9);
    const Tensor gpu = wan_image_condition(ctx, vae, first, end, 9);
    ASSERT_EQ(gpu.shape(), cpu.shape());
    ASSERT_TRUE(gpu.device().is_cpu());
    const int64_t mask_values = 4 * cpu.numel() / cpu.size(1);
    EXPECT_EQ(std::memcmp(gpu.data(), cpu.data(), static_cast<size_t>(mask_values) * sizeof(float)), 0);
    const double error = rel_l2(gpu.data_as<float>() + mask_values, cpu.data_as<float>() + mask_values, cpu.numel() - mask_values);
    std::printf("image condition%s on CUDA vs the CPU: rel-L2 %.3g\n", with_last ? " (first and last)" : "", error);
    EXPECT_LE(error, 1e-4);
  }
  WanVae residual = WanVae::load(kResidualDir);
  residual.set_cuda_tf32(false);
  Tensor image = Tensor::empty({1, 3, 32, 48}, DType::kF32);
  fill_normal(image.view(), 8, 0.0, 0.5);
  const Tensor cpu = wan_first_frame_latents(ExecContext{}, residual, image);
  const Tensor gpu = wan_first_frame_latents(ctx, residual, image);
  ASSERT_EQ(gpu.shape(), cpu.shape());
  ASSERT_TRUE(gpu.device().is_cpu());
  EXPECT_LE(rel_l2(gpu.data_as<float>(), cpu.data_as<float>(), cpu.numel()), 1e-4);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
}

}  // namespace
}  // namespace tessel
