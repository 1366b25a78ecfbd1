// The Wan denoising loop with the transformer on CUDA (bf16) against the same loop on the CPU (fp32),
// on the `init-model --preset tiny-cuda` directory (the tiny model with heads of 64, the smallest the
// CUDA attention takes): the prompt through the CPU text encoder, the same
// seeded noise, UniPC with guidance (one batch-2 call per step) and Euler without, and the frames the
// VAE decodes from the CUDA loop's latents.
//
// Yardstick: the CPU loop run on the weights the CUDA model rounds to bf16 (and bf16-rounded text)
// differs from the plain CPU loop by E_round, the error bf16 storage alone implies; the CUDA loop also
// rounds every GEMM and attention operand and the latents entering each step, so its error is
// expected near 2 x E_round and is held to 4 x E_round. A wrong CFG combination, a wrong branch order
// or a misplaced timestep moves the latents by tens of percent.
//
// StepInfo reaches the CUDA transformer's attention: a sparse config whose dense warm-up covers the
// first steps gives exactly the dense loop's latents over those steps and other latents after them.
// TeaCache on the CUDA transformer skips the steps the CPU loop skips. Also: the same seed gives the
// same latents twice; cancellation stops between steps. Skips without a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "diffusion/diffusion_test_util.h"
#include "tessel/core/device.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/cache_backend.h"
#include "tessel/diffusion/scheduler.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/wan_pipeline.h"
#include "tessel/diffusion/wan_text_encoder.h"
#include "tessel/diffusion/wan_vae.h"
#include "tessel/dit/wan_model.h"
#include "tessel/dit/wan_weights.h"
#include "tessel/sparse/builtin_backends.h"
#include "tessel/sparse/config.h"
#include "tessel/sparse/registry.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

// The tiny model written once for the suite, and its text embeddings of one prompt.
class WanPipelineCudaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!cuda_available()) return;
    dir_ = new fs::path(fs::path(::testing::TempDir()) / ("tiny_wan_cuda_" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    write_random_wan_model(dir_->string(), "tiny-cuda", 11);
    const WanTextEncoder encoder = WanTextEncoder::load(dir_->string());
    const Tensor both = encoder.encode(ExecContext{}, {"a cat in the neon city", "blurry"});
    const int64_t length = both.size(1), width = both.size(2);
    prompt_ = new Tensor(Tensor::empty({1, length, width}, DType::kF32));
    negative_ = new Tensor(Tensor::empty({1, length, width}, DType::kF32));
    std::memcpy(prompt_->data(), both.data(), prompt_->nbytes());
    std::memcpy(negative_->data(), both.data_as<float>() + length * width, negative_->nbytes());
  }
  static void TearDownTestSuite() {
    if (dir_ != nullptr) fs::remove_all(*dir_);
    delete dir_;
    delete prompt_;
    delete negative_;
  }

  static std::string transformer_dir() { return (*dir_ / "transformer").string(); }

  // The checkpoint's tensors, optionally with the ones the CUDA model keeps in bf16 rounded to bf16.
  static std::map<std::string, Tensor> weights(bool round_like_cuda) { return wan_transformer_weights(transformer_dir(), round_like_cuda); }

  static WanGenerationResult run(const WanTransformer& transformer, const SchedulerConfig& scheduler_config, double guidance,
                                 const WanVideoSize& size, int64_t steps, const TensorView& prompt, const TensorView& negative,
                                 const WanVae* vae = nullptr, WanGenerationOptions options = {}) {
    return run_wan_loop(transformer, scheduler_config, guidance, size, steps, prompt, negative, vae, std::move(options));
  }

  static fs::path* dir_;
  static Tensor* prompt_;
  static Tensor* negative_;
};

fs::path* WanPipelineCudaTest::dir_ = nullptr;
Tensor* WanPipelineCudaTest::prompt_ = nullptr;
Tensor* WanPipelineCudaTest::negative_ = nullptr;

double latents_error(const WanGenerationResult& actual, const WanGenerationResult& expected) {
  EXPECT_EQ(actual.latents.shape(), expected.latents.shape());
  return rel_l2(actual.latents.data_as<float>(), expected.latents.data_as<float>(), expected.latents.numel());
}

// 9 frames of 80 x 48 pixels: latents (1, 16, 3, 6, 10), a 3 x 3 x 5 patch grid (45 tokens).
const WanVideoSize kSize{9, 48, 80};

TEST_F(WanPipelineCudaTest, LatentsMatchTheCpuLoopWithinBf16Error) {
  SKIP_WITHOUT_GPU();
  const WanTransformer cpu(load_wan_config(transformer_dir()), weights(false));
  const WanTransformer cpu_rounded(load_wan_config(transformer_dir()), weights(true));
  const WanTransformer cuda = WanTransformer::load(transformer_dir(), {}, Device::cuda());
  const Tensor prompt_rounded = bf16_rounded(*prompt_), negative_rounded = bf16_rounded(*negative_);
  struct Case {
    const char* name;
    SchedulerConfig scheduler;
    double guidance;
  };
  for (const Case& c : {Case{"unipc, guidance 5 (batch 2)", wan_unipc(), 5.0}, Case{"euler, no guidance (batch 1)", euler_shift3(), 1.0}}) {
    const WanGenerationResult reference = run(cpu, c.scheduler, c.guidance, kSize, 6, *prompt_, *negative_);
    const WanGenerationResult rounded = run(cpu_rounded, c.scheduler, c.guidance, kSize, 6, prompt_rounded, negative_rounded);
    const WanGenerationResult on_gpu = run(cuda, c.scheduler, c.guidance, kSize, 6, *prompt_, *negative_);
    ASSERT_EQ(on_gpu.steps_done, 6);
    const double e_round = latents_error(rounded, reference), error = latents_error(on_gpu, reference);
    const Tensor noise = wan_initial_noise(kSize.latent_shape(16), 7);
    const double moved = rel_l2(reference.latents.data_as<float>(), noise.data_as<float>(), noise.numel());
    std::printf("%s: CUDA rel-L2 vs CPU %.3e, bf16 storage alone %.3e, latents moved %.3f from the noise\n", c.name, error, e_round,
                moved);
    EXPECT_GT(moved, 0.1) << c.name;  // the loop does change the latents, so the comparison means something
    EXPECT_GT(e_round, 0.0) << c.name;
    EXPECT_LE(error, 4.0 * e_round) << c.name;
  }
}

TEST_F(WanPipelineCudaTest, FramesMatchTheCpuLoop) {
  SKIP_WITHOUT_GPU();
  const WanVae vae = WanVae::load((*dir_ / "vae").string());
  const WanTransformer cpu = WanTransformer::load(transformer_dir());
  const WanTransformer cuda = WanTransformer::load(transformer_dir(), {}, Device::cuda());
  const WanGenerationResult reference = run(cpu, wan_unipc(), 5.0, kSize, 4, *prompt_, *negative_, &vae);
  const WanGenerationResult on_gpu = run(cuda, wan_unipc(), 5.0, kSize, 4, *prompt_, *negative_, &vae);
  ASSERT_EQ(on_gpu.frames.count, 9);
  ASSERT_EQ(on_gpu.frames.rgb.size(), reference.frames.rgb.size());
  double squared = 0.0;
  for (size_t i = 0; i < reference.frames.rgb.size(); ++i) {
    const double d = static_cast<double>(on_gpu.frames.rgb[i]) - reference.frames.rgb[i];
    squared += d * d;
  }
  const double mse = squared / static_cast<double>(reference.frames.rgb.size());
  const double psnr = mse == 0.0 ? 99.0 : 10.0 * std::log10(255.0 * 255.0 / mse);
  std::printf("frames PSNR CUDA loop vs CPU loop: %.2f dB\n", psnr);
  EXPECT_GE(psnr, 30.0);
}

TEST_F(WanPipelineCudaTest, SameSeedSameLatentsAndCancellation) {
  SKIP_WITHOUT_GPU();
  const WanTransformer cuda = WanTransformer::load(transformer_dir(), {}, Device::cuda());
  const WanGenerationResult first = run(cuda, wan_unipc(), 5.0, kSize, 3, *prompt_, *negative_);
  const WanGenerationResult second = run(cuda, wan_unipc(), 5.0, kSize, 3, *prompt_, *negative_);
  EXPECT_EQ(std::memcmp(first.latents.data(), second.latents.data(), first.latents.nbytes()), 0);

  std::atomic<bool> cancel{false};
  WanGenerationOptions options;
  options.cancel = &cancel;
  std::vector<double> scheduler_seconds;
  options.on_step = [&](const WanStepProgress& p) {
    scheduler_seconds.push_back(p.scheduler_seconds);
    if (p.step == 2) cancel = true;
  };
  const WanGenerationResult cancelled = run(cuda, wan_unipc(), 5.0, kSize, 5, *prompt_, *negative_, nullptr, options);
  EXPECT_TRUE(cancelled.cancelled);
  EXPECT_EQ(cancelled.steps_done, 2);
  ASSERT_EQ(scheduler_seconds.size(), 2u);
  for (double s : scheduler_seconds) EXPECT_GE(s, 0.0);
}

TEST_F(WanPipelineCudaTest, StepInfoReachesTheCudaAttention) {
  SKIP_WITHOUT_GPU();
  // 256 x 256 pixels, 9 frames: a 3 x 16 x 16 patch grid, 768 tokens, several 128-token query blocks.
  const WanVideoSize size{9, 256, 256};
  BackendRegistry registry(false);
  register_builtin_backends(registry);
  WanAttentionOptions sparse;
  sparse.registry = &registry;
  // dynamic_topk keeping 30% of the blocks from step 2 on (steps 0 and 1 dense).
  sparse.config = parse_sparse_attn_json(R"({"backend": "dynamic_topk", "pattern": {"type": "dynamic_topk"},
      "selection": {"topk_ratio": 0.3}, "options": {"similarity_threshold": "-2"}, "warmup": {"dense_steps": 2}})");
  const WanTransformer dense = WanTransformer::load(transformer_dir(), {}, Device::cuda());
  const WanTransformer warm = WanTransformer::load(transformer_dir(), sparse, Device::cuda());
  std::vector<Tensor> dense_steps, sparse_steps;
  const auto recorder = [](std::vector<Tensor>& into) {
    WanGenerationOptions options;
    options.on_step = [&into](const WanStepProgress& p) {
      Tensor copy = Tensor::empty(p.latents.shape(), DType::kF32);
      std::memcpy(copy.data(), p.latents.data(), p.latents.nbytes());
      into.push_back(std::move(copy));
    };
    return options;
  };
  run(dense, wan_unipc(), 5.0, size, 4, *prompt_, *negative_, nullptr, recorder(dense_steps));
  run(warm, wan_unipc(), 5.0, size, 4, *prompt_, *negative_, nullptr, recorder(sparse_steps));
  ASSERT_EQ(dense_steps.size(), 4u);
  ASSERT_EQ(sparse_steps.size(), 4u);
  for (int step = 0; step < 2; ++step)
    EXPECT_EQ(std::memcmp(dense_steps[step].data(), sparse_steps[step].data(), dense_steps[step].nbytes()), 0) << "step " << step;
  const double after = rel_l2(sparse_steps[3].data_as<float>(), dense_steps[3].data_as<float>(), dense_steps[3].numel());
  std::printf("dynamic_topk 0.3 after 2 dense steps: latents rel-L2 vs dense %.3e at the last step\n", after);
  EXPECT_GT(after, 1e-6);
  EXPECT_TRUE(std::isfinite(after));
}

// TeaCache with the CUDA transformer: the hooks get the device's hidden states (the residuals stay
// on the device) and host copies of the conditioning, so the skip decisions are the CPU loop's and
// the latents stay within the bf16 yardstick of the CPU loop with the same cache.
TEST_F(WanPipelineCudaTest, TeaCacheSkipsTheStepsTheCpuLoopSkips) {
  SKIP_WITHOUT_GPU();
  const WanTransformer cpu(load_wan_config(transformer_dir()), weights(false));
  const WanTransformer cpu_rounded(load_wan_config(transformer_dir()), weights(true));
  const WanTransformer cuda = WanTransformer::load(transformer_dir(), {}, Device::cuda());
  const Tensor prompt_rounded = bf16_rounded(*prompt_), negative_rounded = bf16_rounded(*negative_);
  CacheConfig config;
  config.teacache_thresh = 0.2;
  const auto cached_run = [&](const WanTransformer& transformer, const TensorView& prompt, const TensorView& negative) {
    const std::unique_ptr<CacheBackend> cache = make_cache_backend("teacache", config, transformer.config());
    WanGenerationOptions options;
    options.cache = cache.get();
    return run(transformer, wan_unipc(), 5.0, kSize, 12, prompt, negative, nullptr, options);
  };
  const WanGenerationResult reference = cached_run(cpu, *prompt_, *negative_);
  const WanGenerationResult rounded = cached_run(cpu_rounded, prompt_rounded, negative_rounded);
  const WanGenerationResult on_gpu = cached_run(cuda, *prompt_, *negative_);
  std::printf("teacache 0.2 over 12 steps: skipped %lld (cond) %lld (uncond) on the CPU, %lld %lld on CUDA\n",
              static_cast<long long>(reference.cache_stats.skipped[0]), static_cast<long long>(reference.cache_stats.skipped[1]),
              static_cast<long long>(on_gpu.cache_stats.skipped[0]), static_cast<long long>(on_gpu.cache_stats.skipped[1]));
  EXPECT_GT(reference.cache_stats.skipped[0], 0);
  EXPECT_EQ(on_gpu.cache_stats.skipped, reference.cache_stats.skipped);
  EXPECT_EQ(on_gpu.cache_stats.computed, reference.cache_stats.computed);
  const double e_round = latents_error(rounded, reference), error = latents_error(on_gpu, reference);
  std::printf("teacache: CUDA rel-L2 vs CPU %.3e, bf16 storage alone %.3e\n", error, e_round);
  EXPECT_LE(error, 4.0 * e_round);
}

}  // namespace
}  // namespace tessel
