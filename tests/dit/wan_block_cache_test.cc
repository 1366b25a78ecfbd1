// The transformer's block-cache hook: a hook that runs the blocks changes nothing and sees what
// entered and left them; a hook that skips them and adds the residual it kept reproduces the
// forward it kept it from; with leading and trailing blocks it is asked after the leading ones, and
// skipping the span between them reproduces the forward too; a per-token timestep and counts
// outside the layers are refused.
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
  ResidualReplay(int64_t leading = 0, int64_t trailing = 0) : leading_(leading), trailing_(trailing) {}
  int64_t leading_blocks() const override { return leading_; }
  int64_t trailing_blocks() const override { return trailing_; }
  bool before_blocks(const WanBlockCacheInput& input, float* hidden) override {
    ++calls;
    EXPECT_NE(input.time_embedding, nullptr);
    EXPECT_NE(input.time_projection, nullptr);
    EXPECT_NE(input.embeddings, nullptr);
    EXPECT_FALSE(input.sequence_sharded);
    // With no leading blocks the hook sees the embeddings themselves.
    if (leading_ == 0)
      EXPECT_EQ(std::memcmp(hidden, input.embeddings, static_cast<size_t>(input.batch * input.tokens * input.dim) * sizeof(float)), 0);
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

 private:
  int64_t leading_, trailing_;
};

void check_replay(int64_t layers, int64_t leading, int64_t trailing) {
  WanConfig config = tiny_config();
  config.num_layers = layers;
  const WanTransformer model = WanTransformer::random(config, 11);
  Tensor latents = Tensor::empty({2, 16, 2, 4, 6}, DType::kF32), text = Tensor::empty({2, 5, 24}, DType::kF32);
  fill_normal(latents.view(), 1);
  fill_normal(text.view(), 2);
  Tensor timestep = Tensor::empty({2}, DType::kF32);
  timestep.data_as<float>()[0] = timestep.data_as<float>()[1] = 700.0f;
  Tensor plain = Tensor::empty(latents.shape(), DType::kF32), first = Tensor::empty(latents.shape(), DType::kF32),
         replayed = Tensor::empty(latents.shape(), DType::kF32);
  const ExecContext ctx;
  model.forward(ctx, StepInfo::at(0, 2), latents.view(), timestep.view(), text.view(), plain.view());
  ResidualReplay cache(leading, trailing);
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
  ResidualReplay too_many(leading + 1, layers - leading);
  EXPECT_THROW(model.forward(ctx, StepInfo{}, latents.view(), timestep.view(), text.view(), plain.view(), nullptr, &too_many), Error);
}

TEST(WanBlockCache, SkippingWithTheKeptResidualReproducesTheForward) { check_replay(2, 0, 0); }

TEST(WanBlockCache, SkippingTheSpanBetweenLeadingAndTrailingBlocksReproducesTheForward) {
  check_replay(4, 1, 1);
  check_replay(3, 2, 0);
}

}  // namespace
}  // namespace tessel
