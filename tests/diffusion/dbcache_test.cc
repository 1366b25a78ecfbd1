// DBCache in the Wan denoising loop, on a tiny random 4-layer transformer: threshold 0 gives the
// uncached latents bit for bit; every decision equals the rule recomputed here in double from what
// the hook is shown (warm-up, relative L1 change of the first blocks' residual against the last
// computed one, the threshold) and a skipped forward adds exactly the middle blocks' kept residual;
// a threshold of 1 or more skips every step the limits allow, counted exactly; bad options are
// errors naming them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "diffusion_test_util.h"
#include "cache_test_fixture.h"
#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/cache_backend.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/wan_pipeline.h"

namespace tessel {
namespace {

constexpr int64_t kSteps = 12;
constexpr int64_t kLayers = 4;

WanConfig four_layer_config() {
  WanConfig c = tiny_wan_transformer_config();
  c.num_layers = kLayers;
  return c;
}

struct Fixture : CachePipelineFixture {
  Fixture() : CachePipelineFixture(four_layer_config(), WanVideoSize{5, 32, 48}, kSteps) {}
};

CacheConfig dbcache_config(int64_t first, int64_t last, double thresh, int64_t warmup) {
  CacheConfig config;
  config.dbcache_first_blocks = first;
  config.dbcache_last_blocks = last;
  config.dbcache_thresh = thresh;
  config.dbcache_warmup_steps = warmup;
  return config;
}

// Wraps DBCache's hook and checks each of its decisions against the rule recomputed in double, per
// batch row (the CFG branch), and that a skip adds the middle residual of the last computed forward.
class CheckedDBCache final : public CacheBackend, public WanBlockCache {
 public:
  CheckedDBCache(const CacheConfig& config, const WanConfig& transformer)
      : inner_(make_cache_backend("dbcache", config, transformer)), thresh_(config.dbcache_thresh),
        warmup_(config.dbcache_warmup_steps) {}
  std::string_view name() const override { return inner_->name(); }
  void refresh(int64_t steps) override {
    inner_->refresh(steps);
    rows_ = {};
  }
  WanBlockCache* block_cache() override { return this; }
  CacheStats stats() const override { return inner_->stats(); }
  int64_t leading_blocks() const override { return inner_->block_cache()->leading_blocks(); }
  int64_t trailing_blocks() const override { return inner_->block_cache()->trailing_blocks(); }

  bool before_blocks(const WanBlockCacheInput& input, float* hidden) override {
    const size_t size = static_cast<size_t>(input.tokens * input.dim);
    const std::vector<float> before(hidden, hidden + input.batch * size);
    std::vector<std::vector<double>> residuals(static_cast<size_t>(input.batch));
    bool expected_run = false;
    for (int64_t b = 0; b < input.batch; ++b) {
      Row& row = rows_[static_cast<size_t>(b)];
      std::vector<double>& residual = residuals[static_cast<size_t>(b)];
      for (size_t i = 0; i < size; ++i)
        residual.push_back(static_cast<double>(before[b * size + i]) - input.embeddings[b * size + i]);
      bool reuse = *input.step->step >= warmup_ && !row.previous.empty();
      if (reuse) {
        double change = 0.0, magnitude = 0.0;
        for (size_t i = 0; i < size; ++i) {
          change += std::abs(row.previous[i] - residual[i]);
          magnitude += std::abs(row.previous[i]);
        }
        diffs.push_back(change / magnitude);
        reuse = change / magnitude < thresh_;
      }
      expected_run = expected_run || !reuse;
    }
    const bool run = inner_->block_cache()->before_blocks(input, hidden);
    EXPECT_EQ(run, expected_run) << "step " << *input.step->step;
    for (int64_t b = 0; b < input.batch; ++b) {
      Row& row = rows_[static_cast<size_t>(b)];
      if (run) {
        row.previous = residuals[static_cast<size_t>(b)];
        EXPECT_EQ(std::memcmp(hidden + b * size, before.data() + b * size, size * sizeof(float)), 0);
        continue;
      }
      ++skips;
      size_t mismatches = 0;
      for (size_t i = 0; i < size; ++i) mismatches += hidden[b * size + i] != before[b * size + i] + row.middle[i];
      EXPECT_EQ(mismatches, 0u) << "row " << b << " of step " << *input.step->step;
    }
    return run;
  }
  void after_blocks(const WanBlockCacheInput& input, const float* blocks_input, const float* hidden) override {
    const size_t size = static_cast<size_t>(input.tokens * input.dim);
    for (int64_t b = 0; b < input.batch; ++b) {
      std::vector<float>& middle = rows_[static_cast<size_t>(b)].middle;
      middle.resize(size);
      for (size_t i = 0; i < size; ++i) middle[i] = hidden[b * size + i] - blocks_input[b * size + i];
    }
    inner_->block_cache()->after_blocks(input, blocks_input, hidden);
  }

  std::vector<double> diffs;  // every relative change compared with the threshold
  int64_t skips = 0;          // rows skipped

 private:
  struct Row {
    std::vector<double> previous;
    std::vector<float> middle;
  };
  std::unique_ptr<CacheBackend> inner_;
  double thresh_;
  int64_t warmup_;
  std::array<Row, 2> rows_;
};

TEST(DBCache, ThresholdZeroEqualsNoCache) {
  const Fixture fixture;
  const WanGenerationResult plain = fixture.generate(nullptr);
  const auto cache = make_cache_backend("dbcache", dbcache_config(1, 1, 0.0, 0), fixture.transformer.config());
  const WanGenerationResult cached = fixture.generate(cache.get());
  EXPECT_TRUE(bit_equal(cached.latents, plain.latents));
  const CacheStats& stats = cached.cache_stats;
  EXPECT_EQ(stats.backend, "dbcache");
  for (size_t branch = 0; branch < 2; ++branch) {
    EXPECT_EQ(stats.computed[branch], kSteps);
    EXPECT_EQ(stats.skipped[branch], 0);
    EXPECT_EQ(stats.blocks_computed[branch], kSteps * kLayers);
    EXPECT_EQ(stats.blocks_skipped[branch], 0);
  }
}

TEST(DBCache, EveryDecisionFollowsTheResidualRule) {
  const Fixture fixture;
  const WanGenerationResult plain = fixture.generate(nullptr);
  // The tiny model's Fn residual changes by 0.07 to 0.17 from step to step (printed below): a
  // threshold inside that range both skips and computes.
  CheckedDBCache cache(dbcache_config(1, 1, 0.12, 2), fixture.transformer.config());
  const WanGenerationResult cached = fixture.generate(&cache);
  const CacheStats& stats = cached.cache_stats;
  std::printf("dbcache F1B1 thresh 0.12: changes");
  for (double d : cache.diffs) std::printf(" %.3f", d);
  std::printf("\n  skipped %lld and %lld of %lld steps, final latents rel-L2 %.3g from uncached\n",
              static_cast<long long>(stats.skipped[0]), static_cast<long long>(stats.skipped[1]),
              static_cast<long long>(kSteps), rel_l2(cached.latents.data_as<float>(), plain.latents.data_as<float>(), plain.latents.numel()));
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_GE(stats.skipped[0], 1);
  EXPECT_GE(stats.computed[0], 3);  // the 2 warm-up steps and at least one computed after them
  EXPECT_EQ(stats.skipped[0], stats.skipped[1]);  // one batch: the branches skip together
  EXPECT_EQ(cache.skips, stats.skipped[0] + stats.skipped[1]);
  for (size_t branch = 0; branch < 2; ++branch) {
    EXPECT_EQ(stats.computed[branch] + stats.skipped[branch], kSteps);
    EXPECT_EQ(stats.blocks_skipped[branch], 2 * stats.skipped[branch]);  // the 2 middle blocks
    EXPECT_EQ(stats.blocks_computed[branch] + stats.blocks_skipped[branch], kSteps * kLayers);
  }
  EXPECT_FALSE(bit_equal(cached.latents, plain.latents));
  EXPECT_LE(rel_l2(cached.latents.data_as<float>(), plain.latents.data_as<float>(), plain.latents.numel()), 0.05);

  // refresh() per generation: the same backend gives the same latents again.
  const WanGenerationResult again = fixture.generate(&cache);
  EXPECT_TRUE(bit_equal(again.latents, cached.latents));
  EXPECT_EQ(again.cache_stats.skipped[0], stats.skipped[0]);
}

TEST(DBCache, AHighThresholdSkipsWhatTheLimitsAllow) {
  const Fixture fixture;
  // A threshold of 1 or more reuses without comparing (cache-dit); warm-up 3 and at most 2 skips in
  // a row: steps 0-2 compute, then skip, skip, compute: 3, 4, 6, 7, 9, 10 are skipped.
  CacheConfig config = dbcache_config(2, 1, 5.0, 3);
  config.dbcache_max_consecutive_cached_steps = 2;
  const auto cache = make_cache_backend("dbcache", config, fixture.transformer.config());
  const CacheStats stats = fixture.generate(cache.get()).cache_stats;
  for (size_t branch = 0; branch < 2; ++branch) {
    EXPECT_EQ(stats.skipped[branch], 6);
    EXPECT_EQ(stats.computed[branch], 6);
    EXPECT_EQ(stats.blocks_skipped[branch], 6);  // one middle block (layers 2 of 0..3)
    EXPECT_EQ(stats.blocks_computed[branch], 6 * kLayers + 6 * 3);
  }
  // At most 4 skips in all: 3, 4, 6, 7.
  config.dbcache_max_cached_steps = 4;
  const auto limited = make_cache_backend("dbcache", config, fixture.transformer.config());
  EXPECT_EQ(fixture.generate(limited.get()).cache_stats.skipped[0], 4);
  // No limits: every step after the warm-up; without guidance only the conditional branch counts.
  const auto unlimited = make_cache_backend("dbcache", dbcache_config(1, 0, 1.0, 3), fixture.transformer.config());
  const CacheStats unguided = fixture.generate(unlimited.get(), 1.0).cache_stats;
  EXPECT_EQ(unguided.skipped[0], kSteps - 3);
  EXPECT_EQ(unguided.blocks_skipped[0], (kSteps - 3) * 3);
  EXPECT_EQ(unguided.computed[1] + unguided.skipped[1], 0);
}

void expect_error_naming(const CacheConfig& config, const std::string& name) {
  try {
    make_cache_backend("dbcache", config, four_layer_config());
    ADD_FAILURE() << "accepted a bad " << name;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(DBCache, BadOptionsAreErrorsNamingThem) {
  expect_error_naming(dbcache_config(0, 0, 0.1, 0), "dbcache_first_blocks");
  expect_error_naming(dbcache_config(1, -1, 0.1, 0), "dbcache_last_blocks");
  expect_error_naming(dbcache_config(2, 2, 0.1, 0), "dbcache_first_blocks + dbcache_last_blocks");
  expect_error_naming(dbcache_config(1, 0, -0.1, 0), "dbcache_thresh");
  expect_error_naming(dbcache_config(1, 0, NAN, 0), "dbcache_thresh");
  expect_error_naming(dbcache_config(1, 0, 0.1, -1), "dbcache_warmup_steps");
  CacheConfig config = dbcache_config(1, 0, 0.1, 0);
  config.dbcache_max_cached_steps = -2;
  expect_error_naming(config, "dbcache_max_cached_steps");
  config = dbcache_config(1, 0, 0.1, 0);
  config.dbcache_max_consecutive_cached_steps = -2;
  expect_error_naming(config, "dbcache_max_consecutive_cached_steps");
  // The defaults (cache-dit's F8B0) need more than 8 layers.
  expect_error_naming(CacheConfig{}, "fewer than the transformer's 4 layers");

  // Under sequence parallelism every rank would judge its own shard: refused.
  const auto cache = make_cache_backend("dbcache", dbcache_config(1, 0, 0.1, 0), four_layer_config());
  const StepInfo step = StepInfo::at(0, 2);
  std::vector<float> hidden(4, 0.0f), embeddings(4, 0.0f);
  WanBlockCacheInput input;
  input.step = &step;
  input.batch = 1;
  input.tokens = 2;
  input.dim = 2;
  input.embeddings = embeddings.data();
  input.sequence_sharded = true;
  EXPECT_THROW(cache->block_cache()->before_blocks(input, hidden.data()), Error);
}

}  // namespace
}  // namespace tessel
