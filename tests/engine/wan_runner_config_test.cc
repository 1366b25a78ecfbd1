// The worker configuration the server hands its engine workers as JSON: every field survives the
// trip (a field dropped here would silently run the workers without it, as the second expert once
// was), a missing field takes its default.
#include <gtest/gtest.h>

#include "tessel/engine/wan_serving.h"

namespace tessel::engine {
namespace {

TEST(WanRunnerConfig, EveryFieldSurvivesTheJsonTrip) {
  WanRunnerConfig config;
  config.embeddings_file = "/e.safetensors";
  config.num_threads = 3;
  config.device = "cuda:1";
  config.sparse_attn_config_json = R"({"pattern":"radial"})";
  config.sparse_attn_config_2_json = R"({"pattern":"dense"})";
  config.sparse_attention_settings = {{"fast", R"({"pattern":"local"})"}};
  config.scheduler = "euler";
  config.cache = "teacache";
  config.cache_config.teacache_thresh = 0.25;
  config.flow_shift = 5.0;
  config.ulysses = 2;
  config.ring = 2;
  config.cfg_parallel = true;
  config.ulysses_head_groups = 4;
  config.ulysses_sm_margin = 24;
  config.loras = {{"/a.safetensors", 0.75}, {"/b.safetensors", -1.0}};
  config.loras_2 = {{"/c.safetensors", 1.0}};
  config.lora_ignore_unmatched = true;
  config.lora_adapters = {{"style", {"/s.safetensors", 0.5}}};
  config.offload_blocks = true;
  config.fp8_weights = true;
  config.fp8_attention = true;
  config.transformer_file = "/models/wan_fp8_scaled.safetensors";
  config.transformer_2_file = "/models/wan_low_noise_fp8.safetensors";
  const WanRunnerConfig back = wan_runner_config_from_json(wan_runner_config_to_json(config));
  EXPECT_EQ(back.embeddings_file, config.embeddings_file);
  EXPECT_EQ(back.num_threads, 3);
  EXPECT_EQ(back.device, "cuda:1");
  EXPECT_EQ(back.sparse_attn_config_json, config.sparse_attn_config_json);
  EXPECT_EQ(back.sparse_attn_config_2_json, config.sparse_attn_config_2_json);
  EXPECT_EQ(back.sparse_attention_settings, config.sparse_attention_settings);
  EXPECT_EQ(back.scheduler, "euler");
  EXPECT_EQ(back.cache, "teacache");
  EXPECT_EQ(back.cache_config.teacache_thresh, 0.25);
  EXPECT_EQ(back.flow_shift, 5.0);
  EXPECT_EQ(back.ulysses, 2);
  EXPECT_EQ(back.ring, 2);
  EXPECT_TRUE(back.cfg_parallel);
  EXPECT_EQ(back.ulysses_head_groups, 4);
  EXPECT_EQ(back.ulysses_sm_margin, 24);
  ASSERT_EQ(back.loras.size(), 2u);
  EXPECT_EQ(back.loras[0].path, "/a.safetensors");
  EXPECT_EQ(back.loras[0].scale, 0.75);
  EXPECT_EQ(back.loras[1].scale, -1.0);
  ASSERT_EQ(back.loras_2.size(), 1u);
  EXPECT_EQ(back.loras_2[0].path, "/c.safetensors");
  EXPECT_TRUE(back.lora_ignore_unmatched);
  ASSERT_EQ(back.lora_adapters.size(), 1u);
  EXPECT_EQ(back.lora_adapters[0].first, "style");
  EXPECT_EQ(back.lora_adapters[0].second.path, "/s.safetensors");
  EXPECT_EQ(back.lora_adapters[0].second.scale, 0.5);
  EXPECT_TRUE(back.offload_blocks);
  EXPECT_TRUE(back.fp8_weights);
  EXPECT_TRUE(back.fp8_attention);
  EXPECT_EQ(back.transformer_file, config.transformer_file);
  EXPECT_EQ(back.transformer_2_file, config.transformer_2_file);

  const WanRunnerConfig defaults = wan_runner_config_from_json("{}");
  EXPECT_TRUE(defaults.loras.empty());
  EXPECT_FALSE(defaults.lora_ignore_unmatched);
  EXPECT_FALSE(defaults.offload_blocks);
  EXPECT_FALSE(defaults.fp8_weights);
  EXPECT_FALSE(defaults.fp8_attention);
  EXPECT_EQ(defaults.ulysses_head_groups, 1);
  EXPECT_TRUE(defaults.transformer_file.empty() && defaults.transformer_2_file.empty());
  EXPECT_EQ(defaults.device, "cpu");
}

}  // namespace
}  // namespace tessel::engine
