// DBCache, cache-dit's Dual Block Cache, on the Wan transformer. Per forward and CFG branch:
//   1. the first Fn blocks run; R = their output - the embeddings (the "Fn residual");
//   2. the branch may reuse when it is past the warm-up steps (counted in its own forwards), under both skip limits, the threshold
//      is above 0 and diff = mean|R_prev - R| / mean|R_prev| < threshold, where R_prev is R of the
//      branch's last computed forward (cache-dit's `similarity(prev, curr)`; a threshold of 1 or
//      more reuses without comparing, as there);
//   3. reuse: the middle blocks are skipped and the residual they added in the last computed forward
//      is added to the Fn output; otherwise they run, and R and their residual are kept;
//   4. the last Bn blocks run either way.
// The branches run as one batch, so the middle blocks run for both when either cannot reuse (both
// then keep fresh buffers, as cache-dit does for a computed step). Counting consecutive skips is
// cache-dit's steady-state behaviour: at most max_continuous skips in a row, then one computed step.
#include <array>
#include <cmath>
#include <vector>

#include "cache_backend_kinds.h"
#include "tessel/core/error.h"
#include "tessel/diffusion/cache_backend.h"

namespace tessel {
namespace {

class DBCache final : public CacheBackend, public WanBlockCache {
 public:
  DBCache(const CacheConfig& config, int64_t layers)
      : first_(config.dbcache_first_blocks),
        last_(config.dbcache_last_blocks),
        middle_(layers - config.dbcache_first_blocks - config.dbcache_last_blocks),
        thresh_(config.dbcache_thresh),
        warmup_(config.dbcache_warmup_steps),
        max_cached_(config.dbcache_max_cached_steps),
        max_consecutive_(config.dbcache_max_consecutive_cached_steps) {}

  std::string_view name() const override { return "dbcache"; }
  void refresh(int64_t) override { branches_ = {}; }
  WanBlockCache* block_cache() override { return this; }
  int64_t leading_blocks() const override { return first_; }
  int64_t trailing_blocks() const override { return last_; }

  CacheStats stats() const override {
    CacheStats stats;
    stats.backend = "dbcache";
    for (size_t b = 0; b < 2; ++b) {
      const Branch& branch = branches_[b];
      stats.computed[b] = branch.computed;
      stats.skipped[b] = branch.skipped;
      stats.blocks_computed[b] = branch.computed * (first_ + middle_ + last_) + branch.skipped * (first_ + last_);
      stats.blocks_skipped[b] = branch.skipped * middle_;
    }
    return stats;
  }

  bool before_blocks(const WanBlockCacheInput& input, float* hidden) override {
    if (input.batch < 1 || input.batch > 2) fail_argument("dbcache batch", "1 or 2 (the CFG branches)", input.batch);
    // Each rank would judge its own shard and could decide otherwise than the others.
    if (input.sequence_sharded)
      fail_argument("dbcache", "an unsharded sequence (the residual change is not reduced across ranks)", "sequence parallelism");
    const size_t size = static_cast<size_t>(input.tokens * input.dim);
    std::array<std::vector<float>, 2> residuals;
    bool run = false;
    for (int64_t b = 0; b < input.batch; ++b) {
      std::vector<float>& residual = residuals[static_cast<size_t>(b)];
      keep_span_residual(residual, hidden, input.embeddings, b, size);
      Branch& branch = branches_[cache_branch(input, b)];
      // The branch's own forwards count the warm-up, as a cache-dit context counts its transformer's
      // steps: a second expert (Wan 2.2) warms up from its first step.
      run = run || !can_reuse(branch, branch.computed + branch.skipped, residual);
    }
    for (int64_t b = 0; b < input.batch; ++b) {
      Branch& branch = branches_[cache_branch(input, b)];
      if (run) {
        branch.first_residual = std::move(residuals[static_cast<size_t>(b)]);
        branch.consecutive = 0;
        ++branch.computed;
        continue;
      }
      add_span_residual(hidden, b, branch.middle_residual);
      ++branch.consecutive;
      ++branch.skipped;
    }
    return run;
  }

  void after_blocks(const WanBlockCacheInput& input, const float* blocks_input, const float* hidden) override {
    const size_t size = static_cast<size_t>(input.tokens * input.dim);
    for (int64_t b = 0; b < input.batch; ++b)
      keep_span_residual(branches_[cache_branch(input, b)].middle_residual, hidden, blocks_input, b, size);
  }

 private:
  struct Branch {
    std::vector<float> first_residual;   // R of the last computed forward
    std::vector<float> middle_residual;  // what the middle blocks added in it
    int64_t computed = 0;
    int64_t skipped = 0;
    int64_t consecutive = 0;  // skips since the last computed forward
  };

  bool can_reuse(const Branch& branch, int64_t step, const std::vector<float>& residual) const {
    if (step < warmup_ || thresh_ <= 0.0) return false;
    if (max_cached_ >= 0 && branch.skipped >= max_cached_) return false;
    if (max_consecutive_ >= 0 && branch.consecutive >= max_consecutive_) return false;
    if (branch.first_residual.size() != residual.size() || branch.middle_residual.size() != residual.size()) return false;
    if (thresh_ >= 1.0) return true;  // cache-dit: a threshold of 1 or more means always similar
    double change = 0.0, magnitude = 0.0;
    for (size_t i = 0; i < residual.size(); ++i) {
      const double previous = branch.first_residual[i];
      change += std::abs(previous - static_cast<double>(residual[i]));
      magnitude += std::abs(previous);
    }
    // A zero previous residual gives no relative change to judge (NaN or infinity): compute.
    return magnitude > 0.0 && change / magnitude < thresh_;
  }

  int64_t first_, last_, middle_;
  double thresh_;
  int64_t warmup_, max_cached_, max_consecutive_;
  std::array<Branch, 2> branches_;
};

}  // namespace

std::unique_ptr<CacheBackend> make_dbcache(const CacheConfig& config, const WanConfig& transformer) {
  if (config.dbcache_first_blocks < 1)
    fail_argument("dbcache_first_blocks (Fn)", "at least 1 (their residual decides)", config.dbcache_first_blocks);
  if (config.dbcache_last_blocks < 0) fail_argument("dbcache_last_blocks (Bn)", "at least 0", config.dbcache_last_blocks);
  if (config.dbcache_first_blocks + config.dbcache_last_blocks >= transformer.num_layers)
    fail_argument("dbcache_first_blocks + dbcache_last_blocks (Fn + Bn)",
                  detail::concat("fewer than the transformer's ", transformer.num_layers, " layers (some blocks to skip)"),
                  config.dbcache_first_blocks + config.dbcache_last_blocks);
  if (!(config.dbcache_thresh >= 0.0) || !std::isfinite(config.dbcache_thresh))
    fail_argument("dbcache_thresh", "a finite number >= 0", config.dbcache_thresh);
  if (config.dbcache_warmup_steps < 0) fail_argument("dbcache_warmup_steps", "at least 0", config.dbcache_warmup_steps);
  if (config.dbcache_max_cached_steps < -1)
    fail_argument("dbcache_max_cached_steps", "-1 (no limit) or a count >= 0", config.dbcache_max_cached_steps);
  if (config.dbcache_max_consecutive_cached_steps < -1)
    fail_argument("dbcache_max_consecutive_cached_steps", "-1 (no limit) or a count >= 0",
                  config.dbcache_max_consecutive_cached_steps);
  return std::make_unique<DBCache>(config, transformer.num_layers);
}

}  // namespace tessel
