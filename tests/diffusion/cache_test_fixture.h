// What the cache backends' tests share: a random transformer with fixed prompt embeddings, run
// through the denoising loop (UniPC shift 3, seed 9, one thread) with or without a cache backend.
#pragma once

#include <cstring>

#include "tessel/core/random.h"
#include "tessel/diffusion/cache_backend.h"
#include "tessel/diffusion/wan_pipeline.h"

namespace tessel {

class CachePipelineFixture {
 public:
  CachePipelineFixture(const WanConfig& config, WanVideoSize size, int64_t steps)
      : transformer(WanTransformer::random(config, 5)),
        prompt(Tensor::empty({1, 7, config.text_dim}, DType::kF32)),
        negative(Tensor::empty({1, 7, config.text_dim}, DType::kF32)),
        size_(size),
        steps_(steps) {
    fill_normal(prompt.view(), 1);
    fill_normal(negative.view(), 2);
  }

  WanGenerationResult generate(CacheBackend* cache, double guidance = 5.0) const {
    SchedulerConfig config;
    config.shift = 3.0;
    auto scheduler = make_scheduler(config);
    const WanPipeline pipeline(transformer, *scheduler);
    WanGenerationOptions options;
    options.num_inference_steps = steps_;
    options.guidance_scale = guidance;
    options.seed = 9;
    options.size = size_;
    options.cache = cache;
    ExecContext ctx;
    ctx.num_threads = 1;  // tiny shapes: threads would only add scheduling noise
    return pipeline.generate(ctx, prompt.view(), negative.view(), options);
  }

  WanTransformer transformer;
  Tensor prompt;
  Tensor negative;

 private:
  WanVideoSize size_;
  int64_t steps_;
};

inline bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), static_cast<size_t>(a.nbytes())) == 0;
}

}  // namespace tessel
