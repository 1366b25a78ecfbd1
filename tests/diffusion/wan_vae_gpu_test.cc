// The Wan VAE decoder on CUDA against diffusers' AutoencoderKLWan (the fixtures of wan_vae_test.cc:
// a tiny random Wan 2.1 model, its float64 decode of 3 latent frames of 5 x 7 into 9 frames of
// 40 x 56, and Wan 2.2's residual, patched layout decoding 3 latent frames of 2 x 3 into 9 frames of
// 32 x 48) and against the CPU decoder on random weights and latents of odd sizes. Skips without a
// GPU.
//
// Tolerances. With TF32 off every product is fp32, as on the CPU, but cuDNN may pick Winograd or
// FFT algorithms whose transforms round differently from a direct sum: the CUDA decode is held to
// the CPU decoder's own bound against float64 diffusers (1e-4; the CPU measures about 1e-6), against
// diffusers and against the CPU decode. With TF32 on (the default, as in PyTorch) each convolution
// rounds its operands to 10 mantissa bits (unit roundoff 2^-11, about 5e-4); over the dozen
// convolutions in sequence that is some 1e-3 relative at the output, bounded here by 1e-2. A wrong
// cache step, frame order or channel half moves the output by far more (a whole frame wrong is a
// rel-L2 of order 1).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <string>

#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/core/exec_context.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/wan_vae.h"
#include "diffusion/diffusion_test_util.h"
#include "test_source_dir.h"

namespace tessel {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

// The checkout's fixture, also when the binary was built elsewhere (TESSEL_SOURCE_DIR in the environment).
const std::string kDir = (test_support::source_dir() / "tests/fixtures/diffusion/vae").string();
const std::string kResidualDir = (test_support::source_dir() / "tests/fixtures/diffusion/vae_residual").string();

// A device tensor of `shape` filled with NaN, so any value the decode does not write shows.
Tensor poisoned_on_device(const Shape& shape) {
  Tensor host = Tensor::empty(shape, DType::kF32);
  std::fill_n(host.data_as<float>(), host.numel(), std::numeric_limits<float>::quiet_NaN());
  return host.to(Device::cuda());
}

ExecContext cuda_context() {
  ExecContext ctx;
  ctx.device = Device::cuda();
  return ctx;
}

// Decodes host latents on the GPU into a poisoned device video and returns it on the host.
Tensor decode_on_gpu(const WanVae& vae, const Tensor& latents) {
  const Tensor device_latents = latents.to(Device::cuda());
  Tensor video = poisoned_on_device(vae.decoded_shape(latents.shape()));
  vae.decode(cuda_context(), device_latents, video);
  return video.to(Device::cpu());
}

void expect_in_range(const Tensor& video) {
  for (int64_t i = 0; i < video.numel(); ++i) ASSERT_LE(std::abs(video.data_as<float>()[i]), 1.0f) << "at " << i;  // NaN fails
}

// rel-L2 of the first `frames` frames of `video` against those of `expected` (both (1, C, F, H, W)).
double leading_rel_l2(const Tensor& video, const Tensor& expected, int64_t frames) {
  const int64_t channels = video.size(1), plane = video.size(3) * video.size(4);
  double worst = 0.0;
  for (int64_t c = 0; c < channels; ++c)
    worst = std::max(worst, rel_l2(video.data_as<const float>() + c * video.size(2) * plane,
                                   expected.data_as<const float>() + c * expected.size(2) * plane, frames * plane));
  return worst;
}

// The fixture's VAE (TF32 on or off) with its latents and diffusers' float64 video.
struct Fixture {
  WanVae vae;
  Tensor latents, expected;
};
Fixture load_fixture(bool tf32, const std::string& dir = kDir) {
  WanVae vae = WanVae::load(dir);
  vae.set_cuda_tf32(tf32);
  const SafetensorsFile io = SafetensorsFile::open(dir + "/io.safetensors");
  return Fixture{std::move(vae), io.load("latents"), io.load("video")};
}

TEST(WanVaeGpu, DecodeMatchesDiffusersAndTheCpuInFp32) {
  SKIP_WITHOUT_GPU();
  const auto [vae, latents, expected] = load_fixture(false);
  const Tensor video = decode_on_gpu(vae, latents);
  ASSERT_EQ(video.shape(), expected.shape());
  expect_in_range(video);
  const double vs_diffusers = rel_l2(video.data_as<float>(), expected.data_as<float>(), expected.numel());
  const Tensor cpu = vae.decode(ExecContext{}, latents);
  const double vs_cpu = rel_l2(video.data_as<float>(), cpu.data_as<float>(), cpu.numel());
  std::printf("Wan VAE CUDA decode (fp32) rel-L2: %.3g vs diffusers float64, %.3g vs the CPU decode\n", vs_diffusers, vs_cpu);
  EXPECT_LE(vs_diffusers, 1e-4);
  EXPECT_LE(vs_cpu, 1e-4);
}

TEST(WanVaeGpu, DecodeWithTf32MatchesDiffusers) {
  SKIP_WITHOUT_GPU();
  const auto [vae, latents, expected] = load_fixture(true);  // TF32 allowed: the default
  const Tensor video = decode_on_gpu(vae, latents);
  expect_in_range(video);
  const double error = rel_l2(video.data_as<float>(), expected.data_as<float>(), expected.numel());
  std::printf("Wan VAE CUDA decode (TF32 convolutions) rel-L2 vs diffusers float64: %.3g\n", error);
  EXPECT_LE(error, 1e-2);
}

// One latent frame gives the first video frame, two the first five (the causal cache at work),
// and a decode after decodes of other sizes gives what it gave before (weights and buffers reused).
TEST(WanVaeGpu, FewerLatentFramesGiveTheLeadingFramesAndRedecodingIsIdentical) {
  SKIP_WITHOUT_GPU();
  const auto [vae, latents, expected] = load_fixture(false);
  const Tensor first = decode_on_gpu(vae, latents);
  for (int64_t kept : {1, 2}) {
    const Tensor video = decode_on_gpu(vae, leading_frames(latents, kept));
    const int64_t out_frames = 4 * (kept - 1) + 1;
    ASSERT_EQ(video.shape(), (Shape{1, 3, out_frames, 40, 56}));
    expect_in_range(video);
    EXPECT_LE(leading_rel_l2(video, expected, out_frames), 1e-4) << kept << " latent frames";
  }
  const Tensor again = decode_on_gpu(vae, latents);
  EXPECT_EQ(std::memcmp(first.data_as<float>(), again.data_as<float>(), first.nbytes()), 0);
}

// Random weights of the tiny preset, latents of odd sizes and 1 to 4 frames: CUDA (fp32) against
// the CPU decode.
TEST(WanVaeGpu, RandomOddSizesMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const WanVaeConfig config = tiny_wan_vae_config();
  uint64_t seed = 11;
  const std::map<std::string, Tensor> weights = random_model_weights(wan_vae_weight_specs(config), seed++);
  WanVae vae(config, weights);
  vae.set_cuda_tf32(false);
  const Shape sizes[] = {{1, config.z_dim, 1, 3, 5}, {1, config.z_dim, 4, 7, 3}, {1, config.z_dim, 2, 1, 9}};
  for (const Shape& shape : sizes) {
    Tensor latents = Tensor::empty(shape, DType::kF32);
    fill_normal(latents.view(), seed++);
    const Tensor cpu = vae.decode(ExecContext{}, latents);
    const Tensor gpu = decode_on_gpu(vae, latents);
    ASSERT_EQ(gpu.shape(), cpu.shape());
    expect_in_range(gpu);
    const double error = rel_l2(gpu.data_as<float>(), cpu.data_as<float>(), cpu.numel());
    std::printf("latents %s: CUDA vs CPU rel-L2 %.3g\n", shape_str(shape).c_str(), error);
    EXPECT_LE(error, 1e-4) << shape_str(shape);
  }
}

// Wan 2.2's residual, patched VAE (TI2V-5B's layout at small widths): the duplicated input of each
// up block added after its upsampler, and the 12 decoded channels unpatchified into 2 x 2 pixels.
TEST(WanResidualVaeGpu, DecodeMatchesDiffusersAndTheCpuInFp32) {
  SKIP_WITHOUT_GPU();
  const auto [vae, latents, expected] = load_fixture(false, kResidualDir);
  ASSERT_TRUE(vae.config().is_residual);
  ASSERT_EQ(vae.config().patch_size, 2);
  const Tensor video = decode_on_gpu(vae, latents);
  ASSERT_EQ(video.shape(), (Shape{1, 3, 9, 32, 48}));
  ASSERT_EQ(video.shape(), expected.shape());
  expect_in_range(video);
  int64_t clamped = 0;
  for (int64_t i = 0; i < video.numel(); ++i) clamped += std::abs(video.data_as<float>()[i]) == 1.0f;
  EXPECT_GT(clamped, 0);  // the fixture reaches the clamp, so the comparison covers it
  const double vs_diffusers = rel_l2(video.data_as<float>(), expected.data_as<float>(), expected.numel());
  const Tensor cpu = vae.decode(ExecContext{}, latents);
  const double vs_cpu = rel_l2(video.data_as<float>(), cpu.data_as<float>(), cpu.numel());
  std::printf("Wan 2.2 residual VAE CUDA decode (fp32) rel-L2: %.3g vs diffusers float64, %.3g vs the CPU decode\n", vs_diffusers,
              vs_cpu);
  EXPECT_LE(vs_diffusers, 1e-4);
  EXPECT_LE(vs_cpu, 1e-4);
}

TEST(WanResidualVaeGpu, DecodeWithTf32MatchesDiffusers) {
  SKIP_WITHOUT_GPU();
  const auto [vae, latents, expected] = load_fixture(true, kResidualDir);
  const Tensor video = decode_on_gpu(vae, latents);
  expect_in_range(video);
  const double error = rel_l2(video.data_as<float>(), expected.data_as<float>(), expected.numel());
  std::printf("Wan 2.2 residual VAE CUDA decode (TF32 convolutions) rel-L2 vs diffusers float64: %.3g\n", error);
  EXPECT_LE(error, 1e-2);
}

// The shortcut drops its doubled first frame on the first chunk only: one latent frame gives the
// first video frame and two the first five, on the device as on the CPU; a decode after decodes of
// other sizes gives what it gave before.
TEST(WanResidualVaeGpu, FewerLatentFramesGiveTheLeadingFramesAndRedecodingIsIdentical) {
  SKIP_WITHOUT_GPU();
  const auto [vae, latents, expected] = load_fixture(false, kResidualDir);
  const Tensor first = decode_on_gpu(vae, latents);
  for (int64_t kept : {1, 2}) {
    const Tensor head = leading_frames(latents, kept);
    const Tensor video = decode_on_gpu(vae, head);
    const int64_t out_frames = 4 * (kept - 1) + 1;
    ASSERT_EQ(video.shape(), (Shape{1, 3, out_frames, 32, 48}));
    expect_in_range(video);
    EXPECT_LE(leading_rel_l2(video, expected, out_frames), 1e-4) << kept << " latent frames vs diffusers";
    const Tensor cpu = vae.decode(ExecContext{}, head);
    EXPECT_LE(rel_l2(video.data_as<float>(), cpu.data_as<float>(), cpu.numel()), 1e-4) << kept << " latent frames vs the CPU";
  }
  const Tensor again = decode_on_gpu(vae, latents);
  EXPECT_EQ(std::memcmp(first.data_as<float>(), again.data_as<float>(), first.nbytes()), 0);
}

// Random weights of the tiny TI2V preset's VAE (48 latent channels, Wan 2.2's residual layout at
// decoder width 4), latents of odd sizes and 1 to 3 frames: CUDA (fp32) against the CPU decode.
TEST(WanResidualVaeGpu, RandomTi2vWeightsAtOddSizesMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const WanVaeConfig config = tiny_ti2v_wan_vae_config();
  ASSERT_TRUE(config.is_residual);
  uint64_t seed = 23;
  const std::map<std::string, Tensor> weights = random_model_weights(wan_vae_weight_specs(config), seed++);
  WanVae vae(config, weights);
  vae.set_cuda_tf32(false);
  const Shape sizes[] = {{1, config.z_dim, 1, 3, 5}, {1, config.z_dim, 2, 5, 3}, {1, config.z_dim, 3, 1, 7}};
  for (const Shape& shape : sizes) {
    Tensor latents = Tensor::empty(shape, DType::kF32);
    fill_normal(latents.view(), seed++);
    const Tensor cpu = vae.decode(ExecContext{}, latents);
    const Tensor gpu = decode_on_gpu(vae, latents);
    ASSERT_EQ(gpu.shape(), cpu.shape());
    ASSERT_EQ(gpu.shape(), (Shape{1, 3, 4 * (shape[2] - 1) + 1, 16 * shape[3], 16 * shape[4]}));
    expect_in_range(gpu);
    const double error = rel_l2(gpu.data_as<float>(), cpu.data_as<float>(), cpu.numel());
    std::printf("residual VAE latents %s: CUDA vs CPU rel-L2 %.3g\n", shape_str(shape).c_str(), error);
    EXPECT_LE(error, 1e-4) << shape_str(shape);
  }
}

TEST(WanVaeGpu, MismatchedDevicesAreErrorsNamingTheArgument) {
  SKIP_WITHOUT_GPU();
  const WanVae vae = WanVae::load(kDir);
  const Tensor host_latents = Tensor::zeros({1, 16, 3, 5, 7}, DType::kF32);
  const Tensor device_latents = host_latents.to(Device::cuda());
  Tensor host_video = Tensor::empty({1, 3, 9, 40, 56}, DType::kF32);
  const auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message([&] { vae.decode(cuda_context(), device_latents, host_video); }).find("video"), std::string::npos);
  EXPECT_NE(message([&] { vae.decode(cuda_context(), host_latents, host_video); }).find("latents"), std::string::npos);
  Tensor short_video = poisoned_on_device({1, 3, 5, 40, 56});
  EXPECT_NE(message([&] { vae.decode(cuda_context(), device_latents, short_video); }).find("(1, 3, 9, 40, 56)"), std::string::npos);
}

}  // namespace
}  // namespace tessel
