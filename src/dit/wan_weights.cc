#include "tessel/dit/wan_weights.h"

#include <cmath>

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
  if (config.has_image_branch()) {
    const std::string embedder = "condition_embedder.image_embedder.";
    specs.push_back({embedder + "norm1.weight", {config.image_dim}});
    specs.push_back({embedder + "norm1.bias", {config.image_dim}});
    linear(embedder + "ff.net.0.proj", config.image_dim, config.image_dim);
    linear(embedder + "ff.net.2", config.image_dim, dim);
    specs.push_back({embedder + "norm2.weight", {dim}});
    specs.push_back({embedder + "norm2.bias", {dim}});
    if (config.pos_embed_seq_len > 0) specs.push_back({embedder + "pos_embed", {1, config.pos_embed_seq_len, config.image_dim}});
  }
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    const auto block = [&](const std::string& name) { return wan_block_tensor(layer, name); };
    for (const char* attention : {"attn1", "attn2"}) {
      for (const char* projection : {"to_q", "to_k", "to_v", "to_out.0"})
        linear(block(std::string(attention) + "." + projection), dim, dim);
      specs.push_back({block(std::string(attention) + ".norm_q.weight"), {dim}});
      specs.push_back({block(std::string(attention) + ".norm_k.weight"), {dim}});
    }
    if (config.has_image_branch()) {
      linear(block("attn2.add_k_proj"), config.added_kv_proj_dim, dim);
      linear(block("attn2.add_v_proj"), config.added_kv_proj_dim, dim);
      specs.push_back({block("attn2.norm_added_k.weight"), {dim}});
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

DType wan_cuda_weight_dtype(const std::string& name) {
  const bool conditioning = name.starts_with("condition_embedder.time_");
  const bool table = name.find("scale_shift_table") != std::string::npos;
  const bool norm = name.find("norm") != std::string::npos;
  const bool fp32_output_bias = name == "patch_embedding.bias" || name == "proj_out.bias";
  // The image embedder (diffusers' FP32LayerNorm around its MLP): its GEMMs write fp32 for the
  // norms and the GELU, so their biases are fp32, and so is FLF2V's position table it adds in fp32.
  const bool image_embedder_vector = name.starts_with("condition_embedder.image_embedder.") && !name.ends_with(".weight");
  return conditioning || table || norm || fp32_output_bias || image_embedder_vector ? DType::kF32 : DType::kBF16;
}

bool wan_fp8_weight(const std::string& name) {
  return name.starts_with("blocks.") && name.ends_with(".weight") && name.find("norm") == std::string::npos &&
         name.find("scale_shift_table") == std::string::npos && name.find(".add_") == std::string::npos;
}

WanRandomInit wan_random_init(const WanConfig& config, const WeightSpec& spec) {
  const bool table = spec.name.find("scale_shift_table") != std::string::npos;
  const bool norm_weight = spec.name.find("norm") != std::string::npos && spec.name.ends_with(".weight");
  if (spec.shape.size() >= 2 && !table) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(shape_numel(spec.shape) / spec.shape[0]));
    return {false, -bound, bound};
  }
  if (norm_weight) return {false, 1.0, 1.0};
  if (table) return {true, 0.0, 1.0 / std::sqrt(static_cast<double>(config.inner_dim()))};
  return {false, -0.01, 0.01};
}

}  // namespace tessel
