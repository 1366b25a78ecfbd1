#include "tessel/dit/wan_weights.h"

namespace tessel {

std::string wan_block_tensor(int64_t layer, const std::string& name) {
  return "blocks." + std::to_string(layer) + "." + name;
}

std::vector<WeightSpec> wan_weight_specs(const WanConfig& config) {
  config.validate();
  const int64_t dim = config.inner_dim();
  std::vector<WeightSpec> specs;
  const auto linear = [&](const std::string& name, int64_t in_features, int64_t out_features) {
    specs.push_back({name + ".weight", {out_features, in_features}});
    specs.push_back({name + ".bias", {out_features}});
  };
  specs.push_back({"patch_embedding.weight",
                   {dim, config.in_channels, config.patch_size[0], config.patch_size[1], config.patch_size[2]}});
  specs.push_back({"patch_embedding.bias", {dim}});
  linear("condition_embedder.time_embedder.linear_1", config.freq_dim, dim);
  linear("condition_embedder.time_embedder.linear_2", dim, dim);
  linear("condition_embedder.time_proj", dim, 6 * dim);
  linear("condition_embedder.text_embedder.linear_1", config.text_dim, dim);
  linear("condition_embedder.text_embedder.linear_2", dim, dim);
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    const auto block = [&](const std::string& name) { return wan_block_tensor(layer, name); };
    for (const char* attention : {"attn1", "attn2"}) {
      for (const char* projection : {"to_q", "to_k", "to_v", "to_out.0"})
        linear(block(std::string(attention) + "." + projection), dim, dim);
      specs.push_back({block(std::string(attention) + ".norm_q.weight"), {dim}});
      specs.push_back({block(std::string(attention) + ".norm_k.weight"), {dim}});
    }
    if (config.cross_attn_norm) {
      specs.push_back({block("norm2.weight"), {dim}});
      specs.push_back({block("norm2.bias"), {dim}});
    }
    linear(block("ffn.net.0.proj"), dim, config.ffn_dim);
    linear(block("ffn.net.2"), config.ffn_dim, dim);
    specs.push_back({block("scale_shift_table"), {1, 6, dim}});
  }
  linear("proj_out", dim, config.out_channels * config.patch_volume());
  specs.push_back({"scale_shift_table", {1, 2, dim}});
  return specs;
}

}  // namespace tessel
