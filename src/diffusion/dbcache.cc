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
// The decisions are made here, on the host, for every device; both residuals live where the hidden
// states do (branch_residuals.h: host vectors, or device buffers whose change is reduced on the
// device and read back, one small copy per branch compared).
#include <array>
#include <cmath>
#include <memory>

#include "branch_residuals.h"
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
  void refresh(int64_t) override {
    branches_ = {};
    first_residuals_->clear();
    middle_residuals_->clear();
  }
  WanBlockCache* block_cache() override { return this; }
  int64_t leading_blocks() const override { return first_; }
  int64_t trailing_blocks() const override { return last_; }
  bool handles_device(Device device) const override { return device.is_cpu() || (device.is_cuda() && cuda_compiled()); }

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
    if (input.embeddings == nullptr) fail_argument("dbcache embeddings", "the patch embeddings block 0 got", "none");
    const size_t size = static_cast<size_t>(input.tokens * input.dim);
    use_residuals_on(input.device);
    // One branch that cannot reuse makes the batch run: the others are not compared.
    bool run = false;
    for (int64_t b = 0; b < input.batch && !run; ++b) {
      const size_t offset = static_cast<size_t>(b) * size;
      run = !can_reuse(cache_branch(input, b), input.embeddings + offset, hidden + offset, size, input.stream);
    }
    for (int64_t b = 0; b < input.batch; ++b) {
      const size_t index = cache_branch(input, b), offset = static_cast<size_t>(b) * size;
      Branch& branch = branches_[index];
      if (run) {
        first_residuals_->store(index, input.embeddings + offset, hidden + offset, size, input.stream);
        branch.consecutive = 0;
        ++branch.computed;
        continue;
      }
      middle_residuals_->add_to(index, hidden + offset, size, input.stream);
      ++branch.consecutive;
      ++branch.skipped;
    }
    return run;
  }

  void after_blocks(const WanBlockCacheInput& input, const float* blocks_input, const float* hidden) override {
    const size_t size = static_cast<size_t>(input.tokens * input.dim);
    use_residuals_on(input.device);
    for (int64_t b = 0; b < input.batch; ++b) {
      const size_t offset = static_cast<size_t>(b) * size;
      middle_residuals_->store(cache_branch(input, b), blocks_input + offset, hidden + offset, size, input.stream);
    }
  }

 private:
  struct Branch {
    int64_t computed = 0;
    int64_t skipped = 0;
    int64_t consecutive = 0;  // skips since the last computed forward
  };

  // Whether branch `index` may reuse, given the Fn output `hidden` and the `embeddings` of its row
  // (`size` values each, on the residuals' device).
  bool can_reuse(size_t index, const float* embeddings, const float* hidden, size_t size, StreamHandle stream) const {
    const Branch& branch = branches_[index];
    // The branch's own forwards count the warm-up, as a cache-dit context counts its transformer's
    // steps: a second expert (Wan 2.2) warms up from its first step.
    if (branch.computed + branch.skipped < warmup_ || thresh_ <= 0.0) return false;
    if (max_cached_ >= 0 && branch.skipped >= max_cached_) return false;
    if (max_consecutive_ >= 0 && branch.consecutive >= max_consecutive_) return false;
    if (!first_residuals_->has(index, size) || !middle_residuals_->has(index, size)) return false;
    if (thresh_ >= 1.0) return true;  // cache-dit: a threshold of 1 or more means always similar
    const L1Change sums = first_residuals_->l1_change(index, embeddings, hidden, size, stream);
    // A zero previous residual gives no relative change to judge (NaN or infinity): compute.
    return sums.magnitude > 0.0 && sums.change / sums.magnitude < thresh_;
  }

  // The residuals live where the transformer's hidden states do; a forward on another device than
  // the last one starts them afresh.
  void use_residuals_on(Device device) {
    if (first_residuals_->device() == device) return;
    first_residuals_ = make_branch_residuals(device, "dbcache");
    middle_residuals_ = make_branch_residuals(device, "dbcache");
  }

  int64_t first_, last_, middle_;
  double thresh_;
  int64_t warmup_, max_cached_, max_consecutive_;
  std::array<Branch, 2> branches_;
  // Per branch, of its last computed forward: R, what the first blocks added to the embeddings, and
  // what the middle blocks added.
  std::unique_ptr<BranchResiduals> first_residuals_ = make_host_residuals();
  std::unique_ptr<BranchResiduals> middle_residuals_ = make_host_residuals();
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
