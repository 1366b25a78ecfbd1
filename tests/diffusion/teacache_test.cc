// TeaCache in the Wan denoising loop, on a tiny random transformer: threshold 0 gives the uncached
// latents bit for bit; a threshold that skips steps stays within a measured distance of them; both
// CFG branches keep their own statistics; the state is refreshed per generation; bad names and
// thresholds are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "cache_test_fixture.h"
#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/cache_backend.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/wan_pipeline.h"

namespace tessel {
namespace {

constexpr int64_t kSteps = 12;

struct Fixture : CachePipelineFixture {
  Fixture() : CachePipelineFixture(tiny_wan_transformer_config(), WanVideoSize{5, 32, 32}, kSteps) {}
};

double relative_l2(const Tensor& a, const Tensor& b) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = static_cast<double>(a.data_as<float>()[i]) - b.data_as<float>()[i];
    diff += d * d;
    norm += static_cast<double>(b.data_as<float>()[i]) * b.data_as<float>()[i];
  }
  return std::sqrt(diff / norm);
}

TEST(TeaCache, ThresholdZeroEqualsNoCache) {
  const Fixture fixture;
  const WanGenerationResult plain = fixture.generate(nullptr);
  CacheConfig config;
  config.teacache_thresh = 0.0;
  const auto cache = make_cache_backend("teacache", config, fixture.transformer.config());
  const WanGenerationResult cached = fixture.generate(cache.get());
  EXPECT_TRUE(bit_equal(cached.latents, plain.latents));
  EXPECT_EQ(cached.cache_stats.backend, "teacache");
  EXPECT_EQ(cached.cache_stats.computed[0], kSteps);
  EXPECT_EQ(cached.cache_stats.skipped[0], 0);
  EXPECT_EQ(plain.cache_stats.backend, "");
}

TEST(TeaCache, AThresholdSkipsStepsAndStaysCloseToTheUncachedLatents) {
  const Fixture fixture;
  const WanGenerationResult plain = fixture.generate(nullptr);
  // The tiny model's time projection changes by 0.5 to 1 (relative L1) from step to step, outside
  // the range the published polynomials were fitted on (they turn negative there, so every step
  // after the first five would be skipped): the identity polynomial thresholds the raw change.
  CacheConfig config;
  config.teacache_thresh = 1.5;
  config.teacache_coefficients = {1.0, 0.0};
  const auto cache = make_cache_backend("teacache", config, fixture.transformer.config());
  const WanGenerationResult cached = fixture.generate(cache.get());
  const CacheStats& stats = cached.cache_stats;
  for (size_t branch = 0; branch < 2; ++branch) {
    EXPECT_EQ(stats.computed[branch] + stats.skipped[branch], kSteps) << branch;
    EXPECT_GE(stats.computed[branch], 5) << "the first 5 steps always run";
  }
  EXPECT_GE(stats.skipped[0], 2);
  EXPECT_LE(stats.skipped[0], kSteps - 6) << "the threshold should leave some later steps computed";
  EXPECT_EQ(stats.skipped[0], stats.skipped[1]);  // one timestep per step: both branches agree
  const double distance = relative_l2(cached.latents, plain.latents);
  std::printf("teacache thresh %.2f: %lld of %lld steps skipped, final latents rel-L2 %.3g from uncached\n",
              config.teacache_thresh, static_cast<long long>(stats.skipped[0]), static_cast<long long>(kSteps), distance);
  EXPECT_GT(distance, 0.0);
  EXPECT_LE(distance, 0.02);

  // refresh() at the start of each generation: the same cache gives the same latents again.
  const WanGenerationResult again = fixture.generate(cache.get());
  EXPECT_TRUE(bit_equal(again.latents, cached.latents));
  EXPECT_EQ(again.cache_stats.skipped[0], stats.skipped[0]);

  // Without guidance only the conditional branch runs.
  const WanGenerationResult unguided = fixture.generate(cache.get(), 1.0);
  EXPECT_EQ(unguided.cache_stats.computed[1] + unguided.cache_stats.skipped[1], 0);
  EXPECT_EQ(unguided.cache_stats.computed[0] + unguided.cache_stats.skipped[0], kSteps);
}

// The published set by layout and size: Wan 2.1 I2V 14B takes its 480P set up to the middle of
// 832 x 480 and 1280 x 720 pixels and its 720P set above; T2V 1.3B and 14B theirs; FLF2V and Wan
// 2.2's TI2V-5B have none published (the nearest stands in, said by `published`).
TEST(TeaCache, CoefficientsFollowTheModelAndTheSize) {
  const WanConfig i2v = wan_i2v_14b_transformer_config();
  EXPECT_EQ(wan_teacache_variant(i2v, 480, 832).name, "i2v-480p");
  EXPECT_EQ(wan_teacache_variant(i2v, 720, 1280).name, "i2v-720p");
  EXPECT_EQ(wan_teacache_variant(i2v, 1280, 720).name, "i2v-720p");
  EXPECT_TRUE(wan_teacache_variant(i2v, 720, 1280).published);
  EXPECT_DOUBLE_EQ(wan_teacache_coefficients("i2v-480p", TeaCacheInput::kTimeProjection)[0], 2.57151496e+05);
  EXPECT_DOUBLE_EQ(wan_teacache_coefficients("i2v-720p", TeaCacheInput::kTimeEmbedding)[4], -0.23412683);
  WanConfig flf2v = i2v;
  flf2v.pos_embed_seq_len = 2 * 257;
  EXPECT_FALSE(wan_teacache_variant(flf2v, 480, 832).published);
  EXPECT_EQ(wan_teacache_variant(wan_preset("wan-14b"), 720, 1280).name, "14b");
  EXPECT_TRUE(wan_teacache_variant(wan_preset("wan-14b"), 720, 1280).published);
  EXPECT_EQ(wan_teacache_variant(wan_preset("wan-1.3b"), 480, 832).name, "1.3b");
  EXPECT_FALSE(wan_teacache_variant(wan_ti2v_5b_transformer_config(), 704, 1280).published);
  // make_cache_backend takes the request's size for that choice.
  CacheConfig config;
  config.teacache_thresh = 0.1;
  EXPECT_NE(make_cache_backend("teacache", config, i2v, 480, 832), nullptr);
}

TEST(TeaCache, PublishedCoefficientsAndBadConfigs) {
  EXPECT_DOUBLE_EQ(wan_teacache_coefficients("1.3b", TeaCacheInput::kTimeProjection)[0], -5.21862437e+04);
  EXPECT_DOUBLE_EQ(wan_teacache_coefficients("14b", TeaCacheInput::kTimeEmbedding)[4], -13.02252404);
  // With the published coefficients the tiny model's large changes rescale below any threshold:
  // every step after the first five is skipped.
  const Fixture fixture;
  CacheConfig published;
  published.teacache_thresh = 0.1;
  const auto cache = make_cache_backend("teacache", published, fixture.transformer.config());
  EXPECT_EQ(fixture.generate(cache.get()).cache_stats.skipped[0], kSteps - 5);
  EXPECT_THROW(wan_teacache_coefficients("5b", TeaCacheInput::kTimeProjection), Error);
  const WanConfig transformer = tiny_wan_transformer_config();
  EXPECT_EQ(make_cache_backend("none", CacheConfig{}, transformer), nullptr);
  try {
    make_cache_backend("dbcache2", CacheConfig{}, transformer);
    FAIL() << "unknown backend accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("none, teacache, dbcache"), std::string::npos) << e.what();
  }
  CacheConfig negative;
  negative.teacache_thresh = -0.1;
  EXPECT_THROW(make_cache_backend("teacache", negative, transformer), Error);
  CacheConfig not_a_number;
  not_a_number.teacache_coefficients = {1.0, NAN};
  EXPECT_THROW(make_cache_backend("teacache", not_a_number, transformer), Error);
}

}  // namespace
}  // namespace tessel
