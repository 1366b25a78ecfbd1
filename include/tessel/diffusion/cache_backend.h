// Cache backends: what lets a generation reuse work from one denoising step to the next, behind one
// interface (refresh per generation, the hook the transformer calls, statistics), selected by name
// as the sparse backends are.
//
// "teacache" (TeaCache for Wan 2.1): per CFG branch, the relative L1 change of the transformer's
// time conditioning from the branch's previous forward, rescaled by a polynomial fitted per model,
// is accumulated; while the sum stays below the threshold the blocks are skipped and the residual
// they added last time (output minus input of the blocks) is added instead; once it reaches the
// threshold the blocks run, the residual is renewed and the sum restarts at 0.
//
// "dbcache" (cache-dit's Dual Block Cache): the first Fn blocks always run; per CFG branch the
// relative L1 change of what they added (their output minus the embeddings) from the branch's last
// computed forward decides: below the threshold the middle blocks are skipped and the residual they
// added in that forward is added instead; the last Bn blocks always run.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/dit/wan_config.h"
#include "tessel/dit/wan_model.h"

namespace tessel {

// What TeaCache measures the change of, with the step ranges it always computes (as TeaCache4Wan2.1):
//   kTimeProjection ("use_ret_steps"): the (6 x dim) time projection every block's modulation adds;
//     the first 5 steps always run.
//   kTimeEmbedding: the time embedding; the first and the last step always run.
enum class TeaCacheInput { kTimeProjection, kTimeEmbedding };

struct CacheConfig {
  // TeaCache: the accumulated rescaled change below which the blocks are skipped. 0 never skips.
  double teacache_thresh = 0.08;
  TeaCacheInput teacache_input = TeaCacheInput::kTimeProjection;
  // The rescaling polynomial, highest degree first (numpy's poly1d order). Empty: the published
  // Wan 2.1 T2V coefficients for the input kind, those of 14B for a transformer of width 5120 and
  // those of 1.3B otherwise.
  std::vector<double> teacache_coefficients;

  // DBCache (cache-dit's names in brackets; the defaults are cache-dit's).
  int64_t dbcache_first_blocks = 8;  // [Fn_compute_blocks] always run first; their residual decides; >= 1
  int64_t dbcache_last_blocks = 0;   // [Bn_compute_blocks] always run last
  // [residual_diff_threshold] the middle blocks are skipped while mean|R - R_prev| / mean|R_prev| of
  // the first blocks' residual R stays below it. 0 never skips.
  double dbcache_thresh = 0.08;
  int64_t dbcache_warmup_steps = 8;     // [max_warmup_steps] the first steps always compute
  int64_t dbcache_max_cached_steps = -1;  // [max_cached_steps] skips per branch and generation; -1: no limit
  // [max_continuous_cached_steps] skips in a row, after which a step computes; -1: no limit.
  int64_t dbcache_max_consecutive_cached_steps = -1;
};

// TeaCache4Wan2.1's published coefficients: text-to-video "1.3b" and "14b", image-to-video 14B
// "i2v-480p" and "i2v-720p"; Error for another name.
std::vector<double> wan_teacache_coefficients(std::string_view model, TeaCacheInput input);

// The published set for a transformer and a request's size: Wan 2.1 I2V's 480P or 720P set by the
// size (720P's above the middle of 832 x 480 and 1280 x 720 pixels), else T2V 14B's for a width of
// 5,120 and 1.3B's for others. `published` is false where no set was published for the layout —
// FLF2V, Wan 2.2 I2V-A14B and TI2V-5B — and the nearest set stands in (a warning says so).
struct WanTeaCacheVariant {
  std::string name;
  bool published = true;
};
WanTeaCacheVariant wan_teacache_variant(const WanConfig& transformer, int64_t height, int64_t width);

struct CacheStats {
  std::string backend;
  // Per CFG branch (0 conditional, 1 unconditional): forwards whose blocks ran, and skipped.
  std::array<int64_t, 2> computed{};
  std::array<int64_t, 2> skipped{};
  // Per CFG branch: transformer blocks run and skipped over the generation (a TeaCache skip skips
  // every block, a DBCache skip the middle ones).
  std::array<int64_t, 2> blocks_computed{};
  std::array<int64_t, 2> blocks_skipped{};
};

class CacheBackend {
 public:
  virtual ~CacheBackend() = default;
  virtual std::string_view name() const = 0;
  // Forgets everything kept: called by the pipeline before each generation.
  virtual void refresh(int64_t num_inference_steps) = 0;
  // The hook the pipeline hands every transformer forward of the generation.
  virtual WanBlockCache* block_cache() = 0;
  virtual CacheStats stats() const = 0;
};

// "none", "teacache" and "dbcache".
std::vector<std::string> cache_backend_names();
// The backend named `name` for `transformer`; null for "none". Throws Error listing the names for
// an unknown one, or naming a bad config field of the named backend (a negative threshold,
// non-finite coefficients; DBCache: Fn < 1, Bn < 0, Fn + Bn not below the transformer's layers,
// negative warm-up steps, a limit below -1).
// `height` x `width`: the request's video size in pixels (TeaCache's coefficients depend on it for
// image to video; 0 x 0 when unknown).
std::unique_ptr<CacheBackend> make_cache_backend(std::string_view name, const CacheConfig& config, const WanConfig& transformer,
                                                 int64_t height = 0, int64_t width = 0);

}  // namespace tessel
