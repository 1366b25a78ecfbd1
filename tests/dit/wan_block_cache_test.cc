// The transformer's block-cache hook: a hook that runs the blocks changes nothing and sees what
// entered and left them; a hook that skips them and adds the residual it kept reproduces the
// forward it kept it from; a per-token timestep is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "tessel/dit/wan_model.h"

namespace tessel {
namespace {

WanConfig tiny_config() {
  WanConfig c;
  c.num_attention_heads = 2;
  c.attention_head_dim = 16;
  c.text_dim = 24;
  c.freq_dim = 16;
  c.ffn_dim = 32;
  c.num_layers = 2;
  c.rope_max_seq_len = 32;
  return c;
}

// Runs the blocks on its first forward and keeps their residual; skips them afterwards.
class ResidualReplay : public WanBlockCache {
 public:
  bool before_blocks(const WanBlockCacheInput& input, float* hidden) override {
    ++calls;
    EXPECT_NE(input.time_embedding, nullptr);
    EXPECT_NE(input.time_projection, nullptr);
    if (residual.empty()) return true;
    for (size_t i = 0; i < residual.size(); ++i) hidden[i] += residual[i];
    return false;
  }
  void after_blocks(const WanBlockCacheInput& input, const float* blocks_input, const float* hidden) override {
    residual.resize(static_cast<size_t>(input.batch * input.tokens * input.dim));
    for (size_t i = 0; i < residual.size(); ++i) residual[i] = hidden[i] - blocks_input[i];
  }
  std::vector<float> residual;
  int calls = 0;
};

TEST(WanBlockCache, SkippingWithTheKeptResidualReproducesTheForward) {
  const WanTransformer model = WanTransformer::random(tiny_config(), 11);
  Tensor latents = Tensor::empty({2, 16, 2, 4, 6}, DType::kF32), text = Tensor::empty({2, 5, 24}, DType::kF32);
  fill_normal(latents.view(), 1);
  fill_normal(text.view(), 2);
  Tensor timestep = Tensor::empty({2}, DType::kF32);
  timestep.data_as<float>()[0] = timestep.data_as<float>()[1] = 700.0f;
  Tensor plain = Tensor::empty(latents.shape(), DType::kF32), first = Tensor::empty(latents.shape(), DType::kF32),
         replayed = Tensor::empty(latents.shape(), DType::kF32);
  const ExecContext ctx;
  model.forward(ctx, StepInfo::at(0, 2), latents.view(), timestep.view(), text.view(), plain.view());
  ResidualReplay cache;
  model.forward(ctx, StepInfo::at(0, 2), latents.view(), timestep.view(), text.view(), first.view(), nullptr, &cache);
  model.forward(ctx, StepInfo::at(1, 2), latents.view(), timestep.view(), text.view(), replayed.view(), nullptr, &cache);
  EXPECT_EQ(cache.calls, 2);
  const size_t bytes = static_cast<size_t>(plain.numel()) * sizeof(float);
  EXPECT_EQ(std::memcmp(plain.data_as<float>(), first.data_as<float>(), bytes), 0);
  // The replayed forward adds (out - in) of the kept blocks to the same embeddings: equal up to
  // the rounding of that subtraction and addition.
  for (int64_t i = 0; i < plain.numel(); ++i)
    ASSERT_NEAR(replayed.data_as<float>()[i], plain.data_as<float>()[i], 1e-5f * (1.0f + std::abs(plain.data_as<float>()[i]))) << i;

  Tensor per_token = Tensor::zeros({2, 2 * 2 * 3}, DType::kF32);
  EXPECT_THROW(model.forward(ctx, StepInfo{}, latents.view(), per_token.view(), text.view(), plain.view(), nullptr, &cache), Error);
}

}  // namespace
}  // namespace tessel
