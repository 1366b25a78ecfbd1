#include "tessel/dit/wan_config.h"

#include <functional>
#include <map>

#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/limited_json.h"

namespace tessel {
namespace {

constexpr uint64_t kMaxConfigBytes = 1 << 20;
// Sizes above this are certainly not a Wan model; keeping them out also keeps products in int64.
constexpr int64_t kMaxSize = int64_t{1} << 20;

int64_t positive_int(const nlohmann::json& value, const std::string& key, const std::string& source) {
  if (!value.is_number_integer())
    fail_argument(source + ": " + key, "an integer", json_excerpt(value));
  const int64_t v = value.get<int64_t>();
  if (v < 1 || v > kMaxSize)
    fail_argument(source + ": " + key, detail::concat("an integer in [1, ", kMaxSize, "]"), v);
  return v;
}

bool boolean(const nlohmann::json& value, const std::string& key, const std::string& source) {
  if (!value.is_boolean()) fail_argument(source + ": " + key, "true or false", json_excerpt(value));
  return value.get<bool>();
}

// A field of WanTransformer3DModel that diffusers leaves null when absent: 0 then.
int64_t optional_positive_int(const nlohmann::json& value, const std::string& key, const std::string& source) {
  return value.is_null() ? 0 : positive_int(value, key, source);
}

}  // namespace

void WanConfig::validate() const {
  for (int axis = 0; axis < 3; ++axis)
    if (patch_size[axis] < 1 || patch_size[axis] > 64)
      fail_argument(detail::concat("patch_size[", axis, "]"), "an integer in [1, 64]", patch_size[axis]);
  const std::pair<const char*, int64_t> sizes[] = {
      {"num_attention_heads", num_attention_heads}, {"attention_head_dim", attention_head_dim},
      {"in_channels", in_channels}, {"out_channels", out_channels}, {"text_dim", text_dim},
      {"freq_dim", freq_dim}, {"ffn_dim", ffn_dim}, {"num_layers", num_layers},
      {"rope_max_seq_len", rope_max_seq_len}};
  for (const auto& [name, value] : sizes)
    if (value < 1 || value > kMaxSize) fail_argument(name, detail::concat("an integer in [1, ", kMaxSize, "]"), value);
  // The rotary embedding gives height and width 2 * (head_dim / 6) dimensions each and frames the
  // rest; every part rotates pairs, so the head dimension must be even and leave frames a pair.
  if (attention_head_dim % 2 != 0 || attention_head_dim < 6)
    fail_argument("attention_head_dim", "an even number >= 6 (the 3-D rotary embedding splits it in pairs)",
                  attention_head_dim);
  if (freq_dim % 2 != 0) fail_argument("freq_dim", "an even number (half sine, half cosine)", freq_dim);
  if (!(eps > 0.0 && eps < 1.0)) fail_argument("eps", "a number in (0, 1)", eps);
  for (const auto& [name, value] : {std::pair{"image_dim", image_dim}, {"added_kv_proj_dim", added_kv_proj_dim},
                                    {"pos_embed_seq_len", pos_embed_seq_len}})
    if (value < 0 || value > kMaxSize) fail_argument(name, detail::concat("null or an integer in [1, ", kMaxSize, "]"), value);
  // diffusers feeds the image embedder's output (the inner width) to add_k_proj / add_v_proj, and
  // has no use for either half of the branch alone.
  if ((image_dim > 0) != (added_kv_proj_dim > 0))
    fail_argument("image_dim and added_kv_proj_dim", "both null or both set (the image branch has both halves)",
                  detail::concat(image_dim, " and ", added_kv_proj_dim));
  if (added_kv_proj_dim > 0 && added_kv_proj_dim != inner_dim())
    fail_argument("added_kv_proj_dim", detail::concat("the inner width num_attention_heads x attention_head_dim = ", inner_dim()),
                  added_kv_proj_dim);
  if (pos_embed_seq_len > 0 && image_dim == 0)
    fail_argument("pos_embed_seq_len", "null without image_dim (it is the image embedder's position table)", pos_embed_seq_len);
  if (pos_embed_seq_len % 2 != 0)
    fail_argument("pos_embed_seq_len", "an even count (the first and the last frame's image tokens)", pos_embed_seq_len);
}

WanConfig parse_wan_config(std::string_view json_text, const std::string& source) {
  const nlohmann::json json = parse_json_limited(json_text, JsonLimits{}, source);
  if (!json.is_object()) fail_argument(source, "a JSON object", json_excerpt(json));
  WanConfig config;
  using Setter = std::function<void(const nlohmann::json&, const std::string&)>;
  const std::map<std::string, Setter> setters = {
      {"patch_size",
       [&](const nlohmann::json& v, const std::string& key) {
         if (!v.is_array() || v.size() != 3) fail_argument(source + ": " + key, "an array of 3 integers", json_excerpt(v));
         for (int axis = 0; axis < 3; ++axis)
           config.patch_size[axis] = positive_int(v[axis], detail::concat(key, "[", axis, "]"), source);
       }},
      {"num_attention_heads", [&](auto& v, auto& key) { config.num_attention_heads = positive_int(v, key, source); }},
      {"attention_head_dim", [&](auto& v, auto& key) { config.attention_head_dim = positive_int(v, key, source); }},
      {"in_channels", [&](auto& v, auto& key) { config.in_channels = positive_int(v, key, source); }},
      {"out_channels", [&](auto& v, auto& key) { config.out_channels = positive_int(v, key, source); }},
      {"text_dim", [&](auto& v, auto& key) { config.text_dim = positive_int(v, key, source); }},
      {"freq_dim", [&](auto& v, auto& key) { config.freq_dim = positive_int(v, key, source); }},
      {"ffn_dim", [&](auto& v, auto& key) { config.ffn_dim = positive_int(v, key, source); }},
      {"num_layers", [&](auto& v, auto& key) { config.num_layers = positive_int(v, key, source); }},
      {"rope_max_seq_len", [&](auto& v, auto& key) { config.rope_max_seq_len = positive_int(v, key, source); }},
      {"cross_attn_norm", [&](auto& v, auto& key) { config.cross_attn_norm = boolean(v, key, source); }},
      {"qk_norm",
       [&](const nlohmann::json& v, const std::string& key) {
         if (!v.is_null() && !(v.is_string() && v.get<std::string>() == "rms_norm_across_heads"))
           fail_argument(source + ": " + key, "\"rms_norm_across_heads\" or null", json_excerpt(v));
       }},
      {"image_dim", [&](auto& v, auto& key) { config.image_dim = optional_positive_int(v, key, source); }},
      {"added_kv_proj_dim", [&](auto& v, auto& key) { config.added_kv_proj_dim = optional_positive_int(v, key, source); }},
      {"pos_embed_seq_len", [&](auto& v, auto& key) { config.pos_embed_seq_len = optional_positive_int(v, key, source); }},
      {"eps",
       [&](const nlohmann::json& v, const std::string& key) {
         if (!v.is_number()) fail_argument(source + ": " + key, "a number", json_excerpt(v));
         config.eps = v.get<double>();
       }},
  };
  for (const auto& [key, value] : json.items()) {
    if (!key.empty() && key[0] == '_') continue;
    const auto setter = setters.find(key);
    if (setter == setters.end())
      throw Error(detail::concat(source, ": unknown key ", quoted_excerpt(key),
                                 " (a WanTransformer3DModel config has patch_size, num_attention_heads, "
                                 "attention_head_dim, in_channels, out_channels, text_dim, freq_dim, ffn_dim, "
                                 "num_layers, cross_attn_norm, qk_norm, eps, rope_max_seq_len, image_dim, added_kv_proj_dim, pos_embed_seq_len)"));
    setter->second(value, key);
  }
  return validated_config(std::move(config), source);
}

WanConfig load_wan_config(const std::string& checkpoint_dir) {
  const std::string path = checkpoint_dir + "/config.json";
  return parse_wan_config(read_file_bounded(path, kMaxConfigBytes, "checkpoint config"), path);
}

WanConfig wan_preset(std::string_view name) {
  WanConfig config;  // the defaults are Wan2.1-T2V-14B's
  if (name == "wan-14b") return config;
  if (name == "wan-1.3b") {
    config.num_attention_heads = 12;
    config.ffn_dim = 8960;
    config.num_layers = 30;
    return config;
  }
  std::string names;
  for (const std::string& preset : wan_preset_names()) names += (names.empty() ? "" : ", ") + preset;
  fail_argument("Wan model preset", "one of " + names, quoted_excerpt(name));
}

std::vector<std::string> wan_preset_names() { return {"wan-1.3b", "wan-14b"}; }

}  // namespace tessel
