// The Wan VAE's config.json and the names and shapes of its tensors.
#include <cmath>

#include "tessel/core/error.h"
#include "tessel/core/io/limited_json.h"
#include "tessel/diffusion/wan_vae.h"
#include "wan_vae_layout.h"

namespace tessel {
namespace {

constexpr int64_t kMaxChannels = 1 << 14;

int64_t read_size(const nlohmann::json& json, const char* key, int64_t fallback, const std::string& source) {
  const auto value = json.find(key);
  if (value == json.end()) return fallback;
  if (!value->is_number_integer()) fail_argument(source + ": " + key, "an integer", json_excerpt(*value));
  return value->get<int64_t>();
}

template <typename T>
std::vector<T> read_list(const nlohmann::json& json, const char* key, std::vector<T> fallback, const std::string& source) {
  const auto value = json.find(key);
  if (value == json.end()) return fallback;
  if (!value->is_array()) fail_argument(source + ": " + key, "a list", json_excerpt(*value));
  std::vector<T> out;
  for (const nlohmann::json& item : *value) {
    const bool fits = std::is_same_v<T, bool> ? item.is_boolean()
                      : std::is_integral_v<T> ? item.is_number_integer()
                                              : item.is_number();
    if (!fits) fail_argument(source + ": " + key, "a list of " + std::string(std::is_same_v<T, bool> ? "booleans" : "numbers"),
                             json_excerpt(*value));
    out.push_back(item.get<T>());
  }
  return out;
}

void add_conv(std::vector<WeightSpec>& specs, const std::string& name, int64_t out, int64_t in, Shape kernel) {
  Shape shape = {out, in};
  shape.insert(shape.end(), kernel.begin(), kernel.end());
  specs.push_back({name + ".weight", shape});
  specs.push_back({name + ".bias", {out}});
}

void add_residual_block(std::vector<WeightSpec>& specs, const std::string& p, int64_t in, int64_t out) {
  specs.push_back({p + ".norm1.gamma", {in, 1, 1, 1}});
  add_conv(specs, p + ".conv1", out, in, {3, 3, 3});
  specs.push_back({p + ".norm2.gamma", {out, 1, 1, 1}});
  add_conv(specs, p + ".conv2", out, out, {3, 3, 3});
  if (in != out) add_conv(specs, p + ".conv_shortcut", out, in, {1, 1, 1});
}

void add_mid_block(std::vector<WeightSpec>& specs, const std::string& p, int64_t dim) {
  add_residual_block(specs, p + ".resnets.0", dim, dim);
  specs.push_back({p + ".attentions.0.norm.gamma", {dim, 1, 1}});
  add_conv(specs, p + ".attentions.0.to_qkv", 3 * dim, dim, {1, 1});
  add_conv(specs, p + ".attentions.0.proj", dim, dim, {1, 1});
  add_residual_block(specs, p + ".resnets.1", dim, dim);
}

}  // namespace

void WanVaeConfig::validate() const {
  const std::pair<const char*, int64_t> sizes[] = {{"base_dim", base_dim},       {"decoder_base_dim", decoder_base_dim},
                                                   {"z_dim", z_dim},             {"num_res_blocks", num_res_blocks},
                                                   {"in_channels", in_channels}, {"out_channels", out_channels}};
  for (const auto& [name, value] : sizes)
    if (value < 1 || value > kMaxChannels) fail_argument(name, detail::concat("an integer in [1, ", kMaxChannels, "]"), value);
  if (dim_mult.size() < 2 || dim_mult.size() > 8)
    fail_argument("dim_mult", "a list of 2 to 8 multipliers", detail::concat(dim_mult.size(), " entries"));
  for (int64_t m : dim_mult)
    if (m < 1 || m * std::max(base_dim, decoder_base_dim) > kMaxChannels)
      fail_argument("dim_mult", detail::concat("multipliers of at least 1 keeping channels <= ", kMaxChannels), m);
  if (temporal_downsample.size() != dim_mult.size() - 1)
    fail_argument("temperal_downsample", detail::concat(dim_mult.size() - 1, " entries (one per stage but the last)"),
                  detail::concat(temporal_downsample.size(), " entries"));
  for (const auto& [name, list] : {std::pair{"latents_mean", &latents_mean}, std::pair{"latents_std", &latents_std}})
    if (static_cast<int64_t>(list->size()) != z_dim)
      fail_argument(name, detail::concat(z_dim, " values (z_dim)"), detail::concat(list->size(), " values"));
  for (float s : latents_std)
    if (!(std::isfinite(s) && s > 0.0f)) fail_argument("latents_std", "positive finite values", s);
  for (float m : latents_mean)
    if (!std::isfinite(m)) fail_argument("latents_mean", "finite values", m);
}

WanVaeConfig parse_wan_vae_config(std::string_view json_text, const std::string& source) {
  const nlohmann::json json = parse_json_limited(json_text, JsonLimits{}, source);
  if (!json.is_object()) fail_argument(source, "a JSON object", json_excerpt(json));
  if (const auto name = json.find("_class_name"); name != json.end() && *name != "AutoencoderKLWan")
    fail_argument(source + ": _class_name", "\"AutoencoderKLWan\"", json_excerpt(*name));
  if (const auto residual = json.find("is_residual"); residual != json.end() && *residual != false)
    fail_argument(source + ": is_residual", "false (Wan 2.1's VAE; Wan 2.2's residual VAE is not supported)",
                  json_excerpt(*residual));
  if (const auto patch = json.find("patch_size"); patch != json.end() && !patch->is_null() && *patch != 1)
    fail_argument(source + ": patch_size", "null or 1 (Wan 2.2's patched VAE is not supported)", json_excerpt(*patch));
  if (const auto attention = json.find("attn_scales");
      attention != json.end() && !(attention->is_array() && attention->empty()))
    fail_argument(source + ": attn_scales", "[] (no attention inside the down and up blocks, as every Wan VAE)",
                  json_excerpt(*attention));
  WanVaeConfig config;
  try {
    config.base_dim = read_size(json, "base_dim", config.base_dim, source);
    config.decoder_base_dim = config.base_dim;
    if (const auto decoder = json.find("decoder_base_dim"); decoder != json.end() && !decoder->is_null())
      config.decoder_base_dim = read_size(json, "decoder_base_dim", config.base_dim, source);
    config.z_dim = read_size(json, "z_dim", config.z_dim, source);
    config.num_res_blocks = read_size(json, "num_res_blocks", config.num_res_blocks, source);
    config.in_channels = read_size(json, "in_channels", config.in_channels, source);
    config.out_channels = read_size(json, "out_channels", config.out_channels, source);
    config.dim_mult = read_list<int64_t>(json, "dim_mult", config.dim_mult, source);
    config.temporal_downsample = read_list<bool>(json, "temperal_downsample", config.temporal_downsample, source);
    config.latents_mean = read_list<float>(json, "latents_mean", config.latents_mean, source);
    config.latents_std = read_list<float>(json, "latents_std", config.latents_std, source);
    config.validate();
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with(source)) throw;
    throw Error(source + ": " + e.what());
  }
  const int64_t spatial_factor = vae::spatial_factor(config), temporal_factor = vae::temporal_factor(config);
  if (read_size(json, "scale_factor_spatial", spatial_factor, source) != spatial_factor)
    fail_argument(source + ": scale_factor_spatial", detail::concat(spatial_factor, " (2 per stage but the last)"),
                  json_excerpt(json["scale_factor_spatial"]));
  if (read_size(json, "scale_factor_temporal", temporal_factor, source) != temporal_factor)
    fail_argument(source + ": scale_factor_temporal", detail::concat(temporal_factor, " (2 per temperal_downsample stage)"),
                  json_excerpt(json["scale_factor_temporal"]));
  return config;
}

std::string wan_vae_config_json(const WanVaeConfig& c) {
  c.validate();
  const nlohmann::json json = {{"_class_name", "AutoencoderKLWan"},
                               {"_diffusers_version", "0.42.1"},
                               {"attn_scales", nlohmann::json::array()},
                               {"base_dim", c.base_dim},
                               {"decoder_base_dim", c.decoder_base_dim},
                               {"dim_mult", c.dim_mult},
                               {"dropout", 0.0},
                               {"in_channels", c.in_channels},
                               {"is_residual", false},
                               {"latents_mean", c.latents_mean},
                               {"latents_std", c.latents_std},
                               {"num_res_blocks", c.num_res_blocks},
                               {"out_channels", c.out_channels},
                               {"patch_size", nullptr},
                               {"scale_factor_spatial", vae::spatial_factor(c)},
                               {"scale_factor_temporal", vae::temporal_factor(c)},
                               {"temperal_downsample", c.temporal_downsample},
                               {"z_dim", c.z_dim}};
  return json.dump(2) + "\n";
}

namespace vae {

int64_t spatial_factor(const WanVaeConfig& config) { return int64_t{1} << (config.dim_mult.size() - 1); }

int64_t temporal_factor(const WanVaeConfig& config) {
  int64_t factor = 1;
  for (bool halves : config.temporal_downsample) factor *= halves ? 2 : 1;
  return factor;
}

std::vector<DecoderStage> decoder_stages(const WanVaeConfig& config) {
  const int64_t stages = static_cast<int64_t>(config.dim_mult.size());
  std::vector<int64_t> dims = {config.decoder_base_dim * config.dim_mult.back()};
  for (int64_t i = stages - 1; i >= 0; --i) dims.push_back(config.decoder_base_dim * config.dim_mult[static_cast<size_t>(i)]);
  std::vector<DecoderStage> out;
  for (int64_t i = 0; i < stages; ++i) {
    DecoderStage stage;
    // Each upsampler halves the channels, so a later stage starts from half its predecessor's.
    stage.in_dim = i > 0 ? dims[static_cast<size_t>(i)] / 2 : dims[0];
    stage.out_dim = dims[static_cast<size_t>(i) + 1];
    stage.upsample = i != stages - 1;
    stage.temporal = stage.upsample && config.temporal_downsample[static_cast<size_t>(stages - 2 - i)];
    out.push_back(stage);
  }
  return out;
}

std::vector<EncoderStage> encoder_stages(const WanVaeConfig& config) {
  const int64_t stages = static_cast<int64_t>(config.dim_mult.size());
  std::vector<EncoderStage> out;
  int64_t in_dim = config.base_dim;
  for (int64_t i = 0; i < stages; ++i) {
    EncoderStage stage;
    stage.in_dim = in_dim;
    stage.out_dim = config.base_dim * config.dim_mult[static_cast<size_t>(i)];
    stage.downsample = i != stages - 1;
    stage.temporal = stage.downsample && config.temporal_downsample[static_cast<size_t>(i)];
    out.push_back(stage);
    in_dim = stage.out_dim;
  }
  return out;
}

}  // namespace vae

std::vector<WeightSpec> wan_vae_weight_specs(const WanVaeConfig& c) {
  std::vector<WeightSpec> specs;
  // Encoder: its blocks are one flat list (residual blocks, then a downsampler per stage).
  add_conv(specs, "encoder.conv_in", c.base_dim, c.in_channels, {3, 3, 3});
  int64_t index = 0, dim = c.base_dim;
  for (const vae::EncoderStage& stage : vae::encoder_stages(c)) {
    for (int64_t r = 0; r < c.num_res_blocks; ++r, ++index) {
      add_residual_block(specs, "encoder.down_blocks." + std::to_string(index), r == 0 ? stage.in_dim : stage.out_dim,
                         stage.out_dim);
    }
    dim = stage.out_dim;
    if (!stage.downsample) continue;
    const std::string p = "encoder.down_blocks." + std::to_string(index++);
    add_conv(specs, p + ".resample.1", dim, dim, {3, 3});
    if (stage.temporal) add_conv(specs, p + ".time_conv", dim, dim, {3, 1, 1});
  }
  add_mid_block(specs, "encoder.mid_block", dim);
  specs.push_back({"encoder.norm_out.gamma", {dim, 1, 1, 1}});
  add_conv(specs, "encoder.conv_out", 2 * c.z_dim, dim, {3, 3, 3});
  add_conv(specs, "quant_conv", 2 * c.z_dim, 2 * c.z_dim, {1, 1, 1});
  add_conv(specs, "post_quant_conv", c.z_dim, c.z_dim, {1, 1, 1});

  const std::vector<vae::DecoderStage> stages = vae::decoder_stages(c);
  add_conv(specs, "decoder.conv_in", stages[0].in_dim, c.z_dim, {3, 3, 3});
  add_mid_block(specs, "decoder.mid_block", stages[0].in_dim);
  for (size_t i = 0; i < stages.size(); ++i) {
    const std::string p = "decoder.up_blocks." + std::to_string(i);
    for (int64_t r = 0; r <= c.num_res_blocks; ++r)
      add_residual_block(specs, p + ".resnets." + std::to_string(r), r == 0 ? stages[i].in_dim : stages[i].out_dim,
                         stages[i].out_dim);
    if (!stages[i].upsample) continue;
    add_conv(specs, p + ".upsamplers.0.resample.1", stages[i].out_dim / 2, stages[i].out_dim, {3, 3});
    if (stages[i].temporal) add_conv(specs, p + ".upsamplers.0.time_conv", 2 * stages[i].out_dim, stages[i].out_dim, {3, 1, 1});
  }
  specs.push_back({"decoder.norm_out.gamma", {stages.back().out_dim, 1, 1, 1}});
  add_conv(specs, "decoder.conv_out", c.out_channels, stages.back().out_dim, {3, 3, 3});
  return specs;
}

}  // namespace tessel
