// Wan 2.2's two-expert layout (A14B) against diffusers' WanPipeline(transformer, transformer_2,
// boundary_ratio) (tests/fixtures/diffusion/wan22_two_experts/, written by
// scripts/make_pipeline_fixture.py): the high-noise expert is the tiny transformer of
// tests/fixtures/wan/checkpoint, the low-noise one another random transformer of its config. The
// latents after every step and the expert of every step, from the same noise and embeddings; each
// expert's cache keeps its own state; bad arguments are errors naming them.
#include <gtest/gtest.h>

#include <cstring>

#include "diffusion/diffusion_test_util.h"
#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/wan_pipeline.h"

namespace tessel {
namespace {

const std::string kFixtureDir = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures";

class WanTwoExpertsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    high_ = new WanTransformer(WanTransformer::load(kFixtureDir + "/wan/checkpoint"));
    low_ = new WanTransformer(WanTransformer::load(kFixtureDir + "/diffusion/wan22_two_experts/transformer_2"));
    inputs_ = new SafetensorsFile(SafetensorsFile::open(kFixtureDir + "/diffusion/wan_pipeline.safetensors"));
    expected_ = new SafetensorsFile(SafetensorsFile::open(kFixtureDir + "/diffusion/wan22_two_experts/latents.safetensors"));
  }
  static void TearDownTestSuite() {
    delete high_;
    delete low_;
    delete inputs_;
    delete expected_;
  }
  static WanTransformer* high_;
  static WanTransformer* low_;
  static SafetensorsFile* inputs_;
  static SafetensorsFile* expected_;

  static WanGenerationOptions options(int64_t steps, double guidance) {
    WanGenerationOptions options;
    options.num_inference_steps = steps;
    options.guidance_scale = guidance;
    options.size = WanVideoSize{9, 80, 48};  // latent (1, 16, 3, 10, 6)
    return options;
  }

  WanGenerationResult generate(const SchedulerConfig& scheduler_config, double boundary_ratio, const WanGenerationOptions& options) {
    auto scheduler = make_scheduler(scheduler_config);
    const WanPipeline pipeline(*high_, WanLowNoiseExpert{low_, boundary_ratio, 1000}, *scheduler);
    return pipeline.generate(ExecContext{}, inputs_->load("prompt_embeds"), inputs_->load("negative_prompt_embeds"), options,
                             inputs_->load("noise"));
  }

  // Checks every step's latents against diffusers' and the experts that ran them.
  void run_case(const std::string& name, const SchedulerConfig& scheduler_config, double boundary_ratio,
                WanGenerationOptions options) {
    const Tensor expected = expected_->load(name + ".latents");
    const Tensor experts = expected_->load(name + ".experts");
    const int64_t steps = expected.size(0);
    options.num_inference_steps = steps;
    double worst = 0.0;
    int64_t calls = 0;
    options.on_step = [&](const WanStepProgress& progress) {
      const int64_t count = progress.latents.numel();
      const double error = rel_l2(progress.latents.data_as<const float>(), expected.data_as<const float>() + calls * count, count);
      EXPECT_LE(error, 1e-5) << name << " step " << calls;
      worst = std::max(worst, error);
      ++calls;
    };
    const WanGenerationResult result = generate(scheduler_config, boundary_ratio, options);
    EXPECT_EQ(calls, steps);
    ASSERT_EQ(static_cast<int64_t>(result.experts.size()), steps);
    for (int64_t step = 0; step < steps; ++step)
      EXPECT_EQ(result.experts[static_cast<size_t>(step)], static_cast<int>(experts.data_as<float>()[step])) << "step " << step;
    std::printf("%s: worst rel-L2 %.3g over %lld steps\n", name.c_str(), worst, static_cast<long long>(steps));
  }
};

WanTransformer* WanTwoExpertsTest::high_ = nullptr;
WanTransformer* WanTwoExpertsTest::low_ = nullptr;
SafetensorsFile* WanTwoExpertsTest::inputs_ = nullptr;
SafetensorsFile* WanTwoExpertsTest::expected_ = nullptr;

SchedulerConfig unipc_shift3() {
  SchedulerConfig config;
  config.shift = 3.0;
  return config;
}

TEST_F(WanTwoExpertsTest, UniPCWithASecondGuidanceScaleMatchesDiffusers) {
  // Timesteps 999 and 750 about the boundary 875: one step per expert, guidance 5 then 3.
  WanGenerationOptions o = options(2, 5.0);
  o.guidance_scale_2 = 3.0;
  run_case("two_experts_unipc", unipc_shift3(), 0.875, o);
}

TEST_F(WanTwoExpertsTest, EulerWithTheDefaultSecondGuidanceMatchesDiffusers) {
  SchedulerConfig euler;
  euler.kind = SchedulerKind::flow_match_euler;
  euler.shift = 3.0;
  run_case("two_experts_euler", euler, 0.6, options(3, 4.0));  // timesteps 1000, 751.1 | 8.9
}

TEST_F(WanTwoExpertsTest, EachExpertKeepsItsOwnCache) {
  const WanGenerationOptions plain = options(4, 5.0);
  const WanGenerationResult uncached = generate(unipc_shift3(), 0.875, plain);
  CacheConfig config;
  config.teacache_thresh = 0.0;
  const auto cache = make_cache_backend("teacache", config, high_->config());
  const auto cache_2 = make_cache_backend("teacache", config, low_->config());
  WanGenerationOptions cached = plain;
  cached.cache = cache.get();
  cached.cache_2 = cache_2.get();
  const WanGenerationResult result = generate(unipc_shift3(), 0.875, cached);
  EXPECT_EQ(std::memcmp(result.latents.data(), uncached.latents.data(), uncached.latents.nbytes()), 0);
  // Timesteps 999, 900 (high noise) and 750, 501 (low noise) at 4 steps, shift 3.
  EXPECT_EQ(result.experts, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(result.cache_stats.computed[0], 2);
  EXPECT_EQ(result.cache_stats_2.computed[0], 2);
  EXPECT_EQ(result.cache_stats_2.computed[1], 2);
}

TEST_F(WanTwoExpertsTest, DBCacheWarmsUpEachExpertFromItsOwnFirstStep) {
  // 6 steps, shift 3: timesteps 999, 937 on the high-noise expert, 857, 750, 600, 376 on the low-noise
  // one. A threshold of 1 or more reuses whenever allowed; warm-up 2 counts each expert's own steps
  // (a cache-dit context per transformer): the low-noise expert computes 857 and 750, skips 600, 376.
  CacheConfig config;
  config.dbcache_first_blocks = 1;
  config.dbcache_thresh = 2.0;
  config.dbcache_warmup_steps = 2;
  const auto cache = make_cache_backend("dbcache", config, high_->config());
  const auto cache_2 = make_cache_backend("dbcache", config, low_->config());
  WanGenerationOptions o = options(6, 5.0);
  o.cache = cache.get();
  o.cache_2 = cache_2.get();
  const WanGenerationResult result = generate(unipc_shift3(), 0.875, o);
  EXPECT_EQ(result.experts, (std::vector<int>{0, 0, 1, 1, 1, 1}));
  for (size_t branch = 0; branch < 2; ++branch) {
    EXPECT_EQ(result.cache_stats.computed[branch], 2);
    EXPECT_EQ(result.cache_stats.skipped[branch], 0);
    EXPECT_EQ(result.cache_stats_2.computed[branch], 2);
    EXPECT_EQ(result.cache_stats_2.skipped[branch], 2);
  }
}

TEST_F(WanTwoExpertsTest, BadArgumentsAreErrorsNamingThem) {
  auto scheduler = make_scheduler(unipc_shift3());
  const auto expect_error = [](const std::function<void()>& run, const std::string& fragment) {
    try {
      run();
      ADD_FAILURE() << "accepted, expected an error about " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  for (double ratio : {0.0, 1.0, -0.5, std::nan("")})
    expect_error([&] { WanPipeline(*high_, WanLowNoiseExpert{low_, ratio, 1000}, *scheduler); }, "boundary_ratio");
  expect_error([&] { WanPipeline(*high_, WanLowNoiseExpert{nullptr, 0.875, 1000}, *scheduler); }, "transformer_2");
  expect_error([&] { WanPipeline(*high_, WanLowNoiseExpert{low_, 0.875, 0}, *scheduler); }, "num_train_timesteps");
  WanConfig wide = low_->config();
  wide.text_dim = 32;
  const WanTransformer other = WanTransformer::random(wide, 3);
  expect_error([&] { WanPipeline(*high_, WanLowNoiseExpert{&other, 0.875, 1000}, *scheduler); }, "text_dim");

  // guidance_scale_2 and cache_2 belong to the low-noise expert: errors with one expert.
  const WanPipeline single(*high_, *scheduler);
  const Tensor prompt = inputs_->load("prompt_embeds"), negative = inputs_->load("negative_prompt_embeds");
  WanGenerationOptions o = options(1, 5.0);
  o.guidance_scale_2 = 2.0;
  expect_error([&] { single.generate(ExecContext{}, prompt, negative, o); }, "guidance_scale_2");
  const auto cache = make_cache_backend("teacache", CacheConfig{}, high_->config());
  o = options(1, 5.0);
  o.cache_2 = cache.get();
  expect_error([&] { single.generate(ExecContext{}, prompt, negative, o); }, "cache_2");
  const WanPipeline pair(*high_, WanLowNoiseExpert{low_, 0.875, 1000}, *scheduler);
  o.cache = cache.get();
  expect_error([&] { pair.generate(ExecContext{}, prompt, negative, o); }, "cache_2");
  o = options(1, 5.0);
  o.guidance_scale_2 = INFINITY;
  expect_error([&] { pair.generate(ExecContext{}, prompt, negative, o); }, "guidance_scale_2");
}

}  // namespace
}  // namespace tessel
