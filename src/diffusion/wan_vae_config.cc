// The Wan VAE's config.json and the names and shapes of its tensors.
#include <cmath>
#include <filesystem>

#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/limited_json.h"
#include "tessel/diffusion/wan_vae.h"
#include "wan_vae_layout.h"

namespace tessel {
namespace {

constexpr int64_t kMaxChannels = 1 << 14;
constexpr int64_t kMaxPatch = 16;

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

bool read_flag(const nlohmann::json& json, const char* key, bool fallback, const std::string& source) {
  const auto value = json.find(key);
  if (value == json.end() || value->is_null()) return fallback;
  if (!value->is_boolean()) fail_argument(source + ": " + key, "true or false", json_excerpt(*value));
  return value->get<bool>();
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
  if (patch_size < 1 || patch_size > kMaxPatch) fail_argument("patch_size", detail::concat("null or an integer in [1, ", kMaxPatch, "]"), patch_size);
  for (const auto& [name, channels] : {std::pair{"in_channels", in_channels}, std::pair{"out_channels", out_channels}})
    if (channels % (patch_size * patch_size) != 0)
      fail_argument(name, detail::concat("a multiple of patch_size^2 (", patch_size * patch_size, ")"), channels);
  if (!is_residual) return;
  // The residual shortcuts regroup channels: DupUp3D repeats each input channel over a whole number
  // of output values, AvgDown3D averages a whole number of input values into each output channel
  // (diffusers refuses other sizes when it builds the model).
  for (const vae::DecoderStage& stage : vae::decoder_stages(*this)) {
    const int64_t values = stage.out_dim * (stage.temporal ? 8 : 4);
    if (stage.upsample && values % stage.in_dim != 0)
      fail_argument("dim_mult", "decoder stages whose output channels times the upsampling factor are a multiple of the input's",
                    detail::concat(stage.in_dim, " -> ", stage.out_dim, " channels"));
  }
  for (const vae::EncoderStage& stage : vae::encoder_stages(*this)) {
    const int64_t values = stage.in_dim * (stage.downsample ? (stage.temporal ? 8 : 4) : 1);
    if (values % stage.out_dim != 0)
      fail_argument("dim_mult", "encoder stages whose input channels times the downsampling factor are a multiple of the output's",
                    detail::concat(stage.in_dim, " -> ", stage.out_dim, " channels"));
  }
}

int64_t WanVaeConfig::spatial_compression() const { return vae::spatial_factor(*this); }
int64_t WanVaeConfig::temporal_compression() const { return vae::temporal_factor(*this); }

WanVaeConfig wan22_vae_config() {
  WanVaeConfig c;
  c.base_dim = 160;
  c.decoder_base_dim = 256;
  c.z_dim = 48;
  c.is_residual = true;
  c.patch_size = 2;
  c.in_channels = c.out_channels = 12;
  c.latents_mean = {-0.2289f, -0.0052f, -0.1323f, -0.2339f, -0.2799f, 0.0174f,  0.1838f,  0.1557f,  -0.1382f, 0.0542f,
                    0.2813f,  0.0891f,  0.1570f,  -0.0098f, 0.0375f,  -0.1825f, -0.2246f, -0.1207f, -0.0698f, 0.5109f,
                    0.2665f,  -0.2108f, -0.2158f, 0.2502f,  -0.2055f, -0.0322f, 0.1109f,  0.1567f,  -0.0729f, 0.0899f,
                    -0.2799f, -0.1230f, -0.0313f, -0.1649f, 0.0117f,  0.0723f,  -0.2839f, -0.2083f, -0.0520f, 0.3748f,
                    0.0152f,  0.1957f,  0.1433f,  -0.2944f, 0.3573f,  -0.0548f, -0.1681f, -0.0667f};
  c.latents_std = {0.4765f, 1.0364f, 0.4514f, 1.1677f, 0.5313f, 0.4990f, 0.4818f, 0.5013f, 0.8158f, 1.0344f,
                   0.5894f, 1.0901f, 0.6885f, 0.6165f, 0.8454f, 0.4978f, 0.5759f, 0.3523f, 0.7135f, 0.6804f,
                   0.5833f, 1.4146f, 0.8986f, 0.5659f, 0.7069f, 0.5338f, 0.4889f, 0.4917f, 0.4069f, 0.4999f,
                   0.6866f, 0.4093f, 0.5709f, 0.6065f, 0.6415f, 0.4944f, 0.5726f, 1.2042f, 0.5458f, 1.6887f,
                   0.3971f, 1.0600f, 0.3943f, 0.5537f, 0.5444f, 0.4089f, 0.7468f, 0.7744f};
  return c;
}

std::optional<WanVaeConfig> wan_model_vae_config(const std::string& model_dir) {
  const std::filesystem::path config = std::filesystem::path(model_dir) / "vae" / "config.json";
  if (!std::filesystem::is_regular_file(config)) return std::nullopt;
  return parse_wan_vae_config(read_file_bounded(config.string(), 1 << 20, "VAE config"), config.string());
}

int64_t wan_model_vae_spatial_stride(const std::string& model_dir) {
  const std::optional<WanVaeConfig> config = wan_model_vae_config(model_dir);
  return config ? config->spatial_compression() : 8;  // no vae/: Wan 2.1's latent grid
}

WanVaeConfig parse_wan_vae_config(std::string_view json_text, const std::string& source) {
  const nlohmann::json json = parse_json_limited(json_text, JsonLimits{}, source);
  if (!json.is_object()) fail_argument(source, "a JSON object", json_excerpt(json));
  if (const auto name = json.find("_class_name"); name != json.end() && *name != "AutoencoderKLWan")
    fail_argument(source + ": _class_name", "\"AutoencoderKLWan\"", json_excerpt(*name));
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
    config.is_residual = read_flag(json, "is_residual", false, source);
    if (const auto patch = json.find("patch_size"); patch != json.end() && !patch->is_null())
      config.patch_size = read_size(json, "patch_size", 1, source);
    // diffusers 0.42.1's AutoencoderKLWan has no clip_output option (a Wan 2.2 config may carry the
    // key; diffusers ignores it) and clamps every decode to [-1, 1], as tessel does.
    read_flag(json, "clip_output", true, source);
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
                               {"is_residual", c.is_residual},
                               {"latents_mean", c.latents_mean},
                               {"latents_std", c.latents_std},
                               {"num_res_blocks", c.num_res_blocks},
                               {"out_channels", c.out_channels},
                               {"patch_size", c.patch_size == 1 ? nlohmann::json(nullptr) : nlohmann::json(c.patch_size)},
                               {"scale_factor_spatial", vae::spatial_factor(c)},
                               {"scale_factor_temporal", vae::temporal_factor(c)},
                               {"temperal_downsample", c.temporal_downsample},
                               {"z_dim", c.z_dim}};
  return json.dump(2) + "\n";
}

namespace vae {

int64_t spatial_factor(const WanVaeConfig& config) { return (int64_t{1} << (config.dim_mult.size() - 1)) * config.patch_size; }

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
    // Wan 2.1's upsamplers halve the channels, so a later stage starts from half its predecessor's;
    // the residual layout's keep them.
    stage.in_dim = i > 0 && !config.is_residual ? dims[static_cast<size_t>(i)] / 2 : dims[static_cast<size_t>(i)];
    stage.out_dim = dims[static_cast<size_t>(i) + 1];
    stage.upsample = i != stages - 1;
    stage.temporal = stage.upsample && config.temporal_downsample[static_cast<size_t>(stages - 2 - i)];
    stage.upsample_dim = config.is_residual ? stage.out_dim : stage.out_dim / 2;
    stage.duplicate_shortcut = config.is_residual && stage.upsample;
    stage.upsampler_name = config.is_residual ? "upsampler" : "upsamplers.0";
    out.push_back(stage);
  }
  return out;
}

std::vector<EncoderStage> encoder_stages(const WanVaeConfig& config) {
  const int64_t stages = static_cast<int64_t>(config.dim_mult.size());
  std::vector<EncoderStage> out;
  int64_t in_dim = config.base_dim, module = 0;  // module: the flat list's index (Wan 2.1)
  for (int64_t i = 0; i < stages; ++i) {
    EncoderStage stage;
    stage.in_dim = in_dim;
    stage.out_dim = config.base_dim * config.dim_mult[static_cast<size_t>(i)];
    stage.downsample = i != stages - 1;
    stage.temporal = stage.downsample && config.temporal_downsample[static_cast<size_t>(i)];
    stage.average_shortcut = config.is_residual;
    const std::string block = "encoder.down_blocks." + std::to_string(i);
    for (int64_t r = 0; r < config.num_res_blocks; ++r)
      stage.resnet_names.push_back(config.is_residual ? block + ".resnets." + std::to_string(r)
                                                      : "encoder.down_blocks." + std::to_string(module++));
    if (stage.downsample)
      stage.downsampler_name = config.is_residual ? block + ".downsampler" : "encoder.down_blocks." + std::to_string(module++);
    out.push_back(stage);
    in_dim = stage.out_dim;
  }
  return out;
}

}  // namespace vae

std::vector<WeightSpec> wan_vae_weight_specs(const WanVaeConfig& c) {
  std::vector<WeightSpec> specs;
  // Encoder: Wan 2.1's modules are one flat list (residual blocks, then a downsampler per stage), the
  // residual layout's one down block per stage (encoder_stages names them).
  add_conv(specs, "encoder.conv_in", c.base_dim, c.in_channels, {3, 3, 3});
  int64_t dim = c.base_dim;
  for (const vae::EncoderStage& stage : vae::encoder_stages(c)) {
    for (size_t r = 0; r < stage.resnet_names.size(); ++r)
      add_residual_block(specs, stage.resnet_names[r], r == 0 ? stage.in_dim : stage.out_dim, stage.out_dim);
    dim = stage.out_dim;
    if (!stage.downsample) continue;
    add_conv(specs, stage.downsampler_name + ".resample.1", dim, dim, {3, 3});
    if (stage.temporal) add_conv(specs, stage.downsampler_name + ".time_conv", dim, dim, {3, 1, 1});
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
    const std::string upsampler = p + "." + stages[i].upsampler_name;
    add_conv(specs, upsampler + ".resample.1", stages[i].upsample_dim, stages[i].out_dim, {3, 3});
    if (stages[i].temporal) add_conv(specs, upsampler + ".time_conv", 2 * stages[i].out_dim, stages[i].out_dim, {3, 1, 1});
  }
  specs.push_back({"decoder.norm_out.gamma", {stages.back().out_dim, 1, 1, 1}});
  add_conv(specs, "decoder.conv_out", c.out_channels, stages.back().out_dim, {3, 3, 3});
  return specs;
}

}  // namespace tessel
