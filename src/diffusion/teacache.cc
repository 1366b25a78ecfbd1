#include <array>
#include <atomic>
#include <cmath>
#include <vector>

#include "branch_residuals.h"
#include "cache_backend_kinds.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"
#include "tessel/diffusion/cache_backend.h"

namespace tessel {
namespace {

// Wan 2.1's inner width at 14B; smaller transformers take the 1.3B coefficients.
constexpr int64_t kWan14BWidth = 5120;

double evaluate_polynomial(const std::vector<double>& coefficients, double x) {
  double value = 0.0;
  for (double c : coefficients) value = value * x + c;
  return value;
}

class TeaCache final : public CacheBackend, public WanBlockCache {
 public:
  TeaCache(const CacheConfig& config, std::vector<double> coefficients, int64_t layers)
      : thresh_(config.teacache_thresh), input_(config.teacache_input), coefficients_(std::move(coefficients)), layers_(layers) {
    // TeaCache4Wan2.1: ret_steps 5 (time projection) or 1 (time embedding); cutoff at the last
    // step for the time embedding.
    always_first_ = input_ == TeaCacheInput::kTimeProjection ? 5 : 1;
    always_last_ = input_ == TeaCacheInput::kTimeProjection ? 0 : 1;
  }

  std::string_view name() const override { return "teacache"; }

  void refresh(int64_t num_inference_steps) override {
    steps_ = num_inference_steps;
    branches_ = {};
    residuals_->clear();
  }

  WanBlockCache* block_cache() override { return this; }
  bool handles_device(Device device) const override { return device.is_cpu() || (device.is_cuda() && cuda_compiled()); }

  CacheStats stats() const override {
    CacheStats stats;
    stats.backend = "teacache";
    for (size_t b = 0; b < 2; ++b) {
      stats.computed[b] = branches_[b].computed;
      stats.skipped[b] = branches_[b].skipped;
      stats.blocks_computed[b] = branches_[b].computed * layers_;
      stats.blocks_skipped[b] = branches_[b].skipped * layers_;
    }
    return stats;
  }

  bool before_blocks(const WanBlockCacheInput& input, float* hidden) override {
    if (input.batch < 1 || input.batch > 2)
      fail_argument("teacache batch", "1 or 2 (the CFG branches)", input.batch);
    const int64_t width = input_ == TeaCacheInput::kTimeProjection ? 6 * input.dim : input.dim;
    const float* conditioning = input_ == TeaCacheInput::kTimeProjection ? input.time_projection : input.time_embedding;
    const int64_t step = input.step && input.step->step ? *input.step->step : branches_[0].computed + branches_[0].skipped;
    const int64_t steps = input.step && input.step->total_steps > 0 ? input.step->total_steps : steps_;
    const size_t residual_size = static_cast<size_t>(input.tokens * input.dim);
    use_residuals_on(input.device);
    bool run = false;
    for (int64_t b = 0; b < input.batch; ++b) {
      Branch& branch = branches_[cache_branch(input, b)];
      const float* current = conditioning + b * width;
      bool compute = thresh_ <= 0.0 || step < always_first_ || step >= steps - always_last_ ||
                     !residuals_->has(cache_branch(input, b), residual_size) || branch.previous.size() != static_cast<size_t>(width);
      if (!compute) {
        double change = 0.0, magnitude = 0.0;
        for (int64_t i = 0; i < width; ++i) {
          change += std::abs(static_cast<double>(current[i]) - branch.previous[static_cast<size_t>(i)]);
          magnitude += std::abs(static_cast<double>(branch.previous[static_cast<size_t>(i)]));
        }
        if (magnitude > 0.0) {
          branch.accumulated += evaluate_polynomial(coefficients_, change / magnitude);
          compute = !(branch.accumulated < thresh_);
        } else {
          compute = true;
        }
      }
      branch.previous.assign(current, current + width);
      run = run || compute;
    }
    for (int64_t b = 0; b < input.batch; ++b) {
      Branch& branch = branches_[cache_branch(input, b)];
      if (run) {
        // The blocks run for the whole batch: a branch that could have skipped gets a fresh residual.
        branch.accumulated = 0.0;
        ++branch.computed;
        continue;
      }
      residuals_->add_to(cache_branch(input, b), hidden + static_cast<size_t>(b) * residual_size, residual_size, input.stream);
      ++branch.skipped;
    }
    return run;
  }

  void after_blocks(const WanBlockCacheInput& input, const float* blocks_input, const float* hidden) override {
    const size_t residual_size = static_cast<size_t>(input.tokens * input.dim);
    use_residuals_on(input.device);
    for (int64_t b = 0; b < input.batch; ++b) {
      const size_t offset = static_cast<size_t>(b) * residual_size;
      residuals_->store(cache_branch(input, b), blocks_input + offset, hidden + offset, residual_size, input.stream);
    }
  }

 private:
  // The residuals live where the transformer's hidden states do; a forward on another device than
  // the last one starts them afresh.
  void use_residuals_on(Device device) {
    if (residuals_->device() != device) residuals_ = make_branch_residuals(device, "teacache");
  }

  struct Branch {
    double accumulated = 0.0;
    std::vector<float> previous;  // the conditioning of the branch's previous forward
    int64_t computed = 0;
    int64_t skipped = 0;
  };
  double thresh_;
  TeaCacheInput input_;
  std::vector<double> coefficients_;
  int64_t layers_;
  int64_t always_first_ = 0;
  int64_t always_last_ = 0;
  int64_t steps_ = 0;
  std::array<Branch, 2> branches_;
  // What the blocks added in each branch's last computed forward.
  std::unique_ptr<BranchResiduals> residuals_ = make_host_residuals();
};

}  // namespace

std::vector<double> wan_teacache_coefficients(std::string_view model, TeaCacheInput input) {
  // TeaCache4Wan2.1's published sets: the time projection's with its retention steps, the time
  // embedding's without (the modulated input's stand-in).
  const bool projection = input == TeaCacheInput::kTimeProjection;
  if (model == "1.3b")
    return projection ? std::vector<double>{-5.21862437e+04, 9.23041404e+03, -5.28275948e+02, 1.36987616e+01, -4.99875664e-02}
                      : std::vector<double>{2.39676752e+03, -1.31110545e+03, 2.01331979e+02, -8.29855975e+00, 1.37887774e-01};
  if (model == "14b")
    return projection ? std::vector<double>{-3.03318725e+05, 4.90537029e+04, -2.65530556e+03, 5.87365115e+01, -3.15583525e-01}
                      : std::vector<double>{-5784.54975374, 5449.50911966, -1811.16591783, 256.27178429, -13.02252404};
  if (model == "i2v-480p")
    return projection ? std::vector<double>{2.57151496e+05, -3.54229917e+04, 1.40286849e+03, -1.35890334e+01, 1.32517977e-01}
                      : std::vector<double>{-3.02331670e+02, 2.23948934e+02, -5.25463970e+01, 5.87348440e+00, -2.01973289e-01};
  if (model == "i2v-720p")
    return projection ? std::vector<double>{8.10705460e+03, 2.13393892e+03, -3.72934672e+02, 1.66203073e+01, -4.17769401e-02}
                      : std::vector<double>{-114.36346466, 65.26524496, -18.82220707, 4.91518089, -0.23412683};
  fail_argument("teacache model", "\"1.3b\", \"14b\", \"i2v-480p\" or \"i2v-720p\"", quoted_excerpt(model));
}

WanTeaCacheVariant wan_teacache_variant(const WanConfig& transformer, int64_t height, int64_t width) {
  // Wan 2.1 I2V has a 480P and a 720P checkpoint of one architecture, each with its own set: the
  // request's size picks (720P's above the middle of 832 x 480 and 1280 x 720 pixels).
  constexpr int64_t kI2v720pFrom = (832 * 480 + 1280 * 720) / 2;
  const bool image_branch = transformer.has_image_branch();
  if (image_branch) {
    const std::string variant = height * width > kI2v720pFrom ? "i2v-720p" : "i2v-480p";
    // FLF2V (the image branch with a first-and-last position table) has no set of its own.
    return {variant, transformer.pos_embed_seq_len == 0};
  }
  const std::string variant = transformer.inner_dim() >= kWan14BWidth ? "14b" : "1.3b";
  // Wan 2.2's layouts have none: I2V-A14B (the latents and the condition on the input channels,
  // no CLIP) and TI2V-5B (48 latent channels).
  const bool published = transformer.in_channels == transformer.out_channels && transformer.out_channels == 16;
  return {variant, published};
}

std::unique_ptr<CacheBackend> make_teacache(const CacheConfig& config, const WanConfig& transformer, int64_t height, int64_t width) {
  if (!(config.teacache_thresh >= 0.0) || !std::isfinite(config.teacache_thresh))
    fail_argument("teacache_thresh", "a finite number >= 0", config.teacache_thresh);
  std::vector<double> coefficients = config.teacache_coefficients;
  if (coefficients.empty()) {
    const WanTeaCacheVariant variant = wan_teacache_variant(transformer, height, width);
    static std::atomic<bool> warned{false};  // once per process, not per request
    if (!variant.published && !warned.exchange(true))
      log_warning(detail::concat("TeaCache: no published coefficients for this model layout; using Wan 2.1's \"", variant.name,
                                 "\" set (CacheConfig::teacache_coefficients sets others)"));
    coefficients = wan_teacache_coefficients(variant.name, config.teacache_input);
  }
  for (double c : coefficients)
    if (!std::isfinite(c)) fail_argument("teacache_coefficients", "finite numbers", c);
  return std::make_unique<TeaCache>(config, std::move(coefficients), transformer.num_layers);
}

}  // namespace tessel
