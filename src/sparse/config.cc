#include "tessel/sparse/config.h"

#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/limited_json.h"
#include "tessel/sparse/schedule.h"

namespace tessel {
namespace {

using nlohmann::json;

constexpr int64_t kMaxBlockSize = 4096;
// A config is a few hundred bytes, three levels deep ({"options": {"key": value}}); these limits
// leave room for any real one and refuse hostile text before it is built into values.
constexpr JsonLimits kConfigJsonLimits{1 << 20, 16};

std::string field(const std::string& name) { return "sparse_attn." + name; }

[[noreturn]] void fail_type(const std::string& key, const std::string& expected, const json& value) {
  fail_argument(field(key), expected, std::string(value.type_name()) + " " + json_excerpt(value));
}

int64_t get_int(const std::string& key, const json& value) {
  if (!value.is_number_integer()) fail_type(key, "an integer", value);
  // Every integer of the config is a size, count or token position, and those are int32 in masks.
  if (value.is_number_unsigned() ? value.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX)
                                 : (value.get<int64_t>() > INT32_MAX || value.get<int64_t>() < INT32_MIN))
    fail_type(key, "an integer of magnitude below 2^31", value);
  return value.get<int64_t>();
}
double get_number(const std::string& key, const json& value) {
  if (!value.is_number()) fail_type(key, "a number", value);
  return value.get<double>();
}
std::string get_string(const std::string& key, const json& value) {
  if (!value.is_string()) fail_type(key, "a string", value);
  return value.get<std::string>();
}
bool get_bool(const std::string& key, const json& value) {
  if (!value.is_boolean()) fail_type(key, "true or false", value);
  return value.get<bool>();
}
std::optional<int64_t> get_optional_int(const std::string& key, const json& value) {
  if (value.is_null()) return std::nullopt;
  return get_int(key, value);
}

SpatialLayout get_layout(const json& value) {
  if (!value.is_object()) fail_type("spatial_layout", "an object {frames, height, width, patch_size, ordering}", value);
  SpatialLayout layout;
  for (const auto& [key, item] : value.items()) {
    const std::string name = "spatial_layout." + key;
    if (key == "frames") layout.frames = get_int(name, item);
    else if (key == "height") layout.height = get_int(name, item);
    else if (key == "width") layout.width = get_int(name, item);
    else if (key == "patch_size") layout.patch_size = get_int(name, item);
    else if (key == "ordering") layout.ordering = parse_spatial_ordering(get_string(name, item));
    else fail_argument(field(name), "one of frames, height, width, patch_size, ordering", "unknown key");
  }
  return layout;
}

std::string option_value(const std::string& key, const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number() || value.is_boolean()) return value.dump();
  fail_type("options." + key, "a string, number or boolean", value);
}

using Setter = std::function<void(SparseAttnConfig&, const json&)>;

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> table = {
      {"backend", [](SparseAttnConfig& c, const json& v) { c.backend = get_string("backend", v); }},
      {"pattern_type", [](SparseAttnConfig& c, const json& v) { c.pattern_type = get_string("pattern_type", v); }},
      {"topk_ratio", [](SparseAttnConfig& c, const json& v) { c.topk_ratio = get_number("topk_ratio", v); }},
      {"block_size_q", [](SparseAttnConfig& c, const json& v) { c.block_size_q = get_int("block_size_q", v); }},
      {"block_size_kv", [](SparseAttnConfig& c, const json& v) { c.block_size_kv = get_int("block_size_kv", v); }},
      {"window_size", [](SparseAttnConfig& c, const json& v) { c.window_size = get_optional_int("window_size", v); }},
      {"spatial_radius", [](SparseAttnConfig& c, const json& v) { c.spatial_radius = get_optional_int("spatial_radius", v); }},
      {"schedule", [](SparseAttnConfig& c, const json& v) { c.schedule = get_string("schedule", v); }},
      {"dense_timesteps", [](SparseAttnConfig& c, const json& v) { c.dense_timesteps = get_int("dense_timesteps", v); }},
      {"dense_layers", [](SparseAttnConfig& c, const json& v) { c.dense_layers = get_int("dense_layers", v); }},
      {"decay_factor", [](SparseAttnConfig& c, const json& v) { c.decay_factor = get_number("decay_factor", v); }},
      {"local_window_size", [](SparseAttnConfig& c, const json& v) { c.local_window_size = get_int("local_window_size", v); }},
      {"threshold", [](SparseAttnConfig& c, const json& v) { c.threshold = get_number("threshold", v); }},
      {"stride", [](SparseAttnConfig& c, const json& v) { c.stride = get_int("stride", v); }},
      {"spatial_layout",
       [](SparseAttnConfig& c, const json& v) {
         if (v.is_null()) c.spatial_layout.reset();
         else c.spatial_layout = get_layout(v);
       }},
      {"num_text_tokens", [](SparseAttnConfig& c, const json& v) { c.num_text_tokens = get_optional_int("num_text_tokens", v); }},
      {"keep_diagonal", [](SparseAttnConfig& c, const json& v) { c.keep_diagonal = get_bool("keep_diagonal", v); }},
      {"sink_blocks", [](SparseAttnConfig& c, const json& v) { c.sink_blocks = get_int("sink_blocks", v); }},
      {"keep_text", [](SparseAttnConfig& c, const json& v) { c.keep_text = get_bool("keep_text", v); }},
      {"i2i_pattern_type",
       [](SparseAttnConfig& c, const json& v) {
         if (v.is_null()) c.i2i_pattern_type.reset();
         else c.i2i_pattern_type = get_string("i2i_pattern_type", v);
       }},
      {"children",
       [](SparseAttnConfig& c, const json& v) {
         if (!v.is_array()) fail_type("children", "an array of pattern type names", v);
         c.children.clear();
         for (const json& item : v) c.children.push_back(get_string("children[]", item));
       }},
      {"composite_op", [](SparseAttnConfig& c, const json& v) { c.composite_op = get_string("composite_op", v); }},
      {"options",
       [](SparseAttnConfig& c, const json& v) {
         if (!v.is_object()) fail_type("options", "an object of key: value", v);
         for (const auto& [key, item] : v.items()) c.options[key] = option_value(key, item);
       }},
  };
  return table;
}

std::string known_keys() {
  std::string out;
  for (const auto& [key, setter] : setters()) out += (out.empty() ? "" : ", ") + key;
  return out;
}

void check_range(const std::string& name, int64_t value, int64_t low, int64_t high) {
  if (value < low || value > high)
    fail_argument(field(name), "an integer in [" + std::to_string(low) + ", " + std::to_string(high) + "]", value);
}
void check_at_least(const std::string& name, int64_t value, int64_t low) {
  if (value < low) fail_argument(field(name), "an integer >= " + std::to_string(low), value);
}
void check_open_closed(const std::string& name, double value, double low, double high) {
  if (!(value > low && value <= high)) {
    std::ostringstream range;
    range << "a number in (" << low << ", " << high << "]";
    fail_argument(field(name), range.str(), value);
  }
}

std::string read_file(const std::string& path) {
  return read_file_bounded(path, kConfigJsonLimits.max_bytes, "--sparse-attn-config file after '@'");
}

std::optional<std::string> env_value(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

}  // namespace

void SparseAttnConfig::validate() const {
  if (backend.empty()) fail_argument(field("backend"), "a backend name, a plugin path, 'auto' or 'none'", "''");
  parse_pattern_type(pattern_type);
  check_open_closed("topk_ratio", topk_ratio, 0.0, 1.0);
  check_range("block_size_q", block_size_q, 1, kMaxBlockSize);
  check_range("block_size_kv", block_size_kv, 1, kMaxBlockSize);
  if (window_size) check_at_least("window_size", *window_size, 0);
  if (spatial_radius) check_at_least("spatial_radius", *spatial_radius, 0);
  if (!has_sparsity_schedule(schedule)) {
    std::string names;
    for (const std::string& name : sparsity_schedule_names()) names += (names.empty() ? "" : ", ") + name;
    fail_argument(field("schedule"), "one of " + names, quoted_excerpt(schedule));
  }
  check_at_least("dense_timesteps", dense_timesteps, 0);
  check_at_least("dense_layers", dense_layers, 0);
  check_open_closed("decay_factor", decay_factor, 0.0, 16.0);
  check_at_least("local_window_size", local_window_size, 1);
  check_open_closed("threshold", threshold, 0.0, 1.0);
  check_range("stride", stride, 1, 64);
  if (spatial_layout) spatial_layout->validate(field("spatial_layout"));
  if (num_text_tokens) check_at_least("num_text_tokens", *num_text_tokens, 0);
  check_at_least("sink_blocks", sink_blocks, 0);
  if (keep_text && !num_text_tokens)
    throw Error(field("keep_text") + ": requires " + field("num_text_tokens") + ", which is not set");
  if (i2i_pattern_type) {
    if (parse_pattern_type(*i2i_pattern_type) == PatternType::kArrow)
      fail_argument(field("i2i_pattern_type"), "a pattern type other than arrow", "'arrow'");
  }
  for (const std::string& child : children) {
    const PatternType type = parse_pattern_type(child);
    if (type == PatternType::kComposite) fail_argument(field("children"), "pattern types other than composite", "'composite'");
  }
  if (composite_op != "union" && composite_op != "intersection")
    fail_argument(field("composite_op"), "'union' or 'intersection'", quoted_excerpt(composite_op));
}

PatternSpec SparseAttnConfig::to_pattern_spec() const {
  PatternSpec spec;
  spec.type = parse_pattern_type(pattern_type);
  spec.block_q = block_size_q;
  spec.block_kv = block_size_kv;
  spec.window_size = window_size;
  spec.spatial_layout = spatial_layout;
  spec.spatial_radius = spatial_radius;
  spec.decay_factor = decay_factor;
  spec.local_window_frames = local_window_size;
  spec.topk_ratio = topk_ratio;
  spec.threshold = threshold;
  spec.stride = stride;
  spec.num_text_tokens = num_text_tokens;
  if (spatial_layout && num_text_tokens) spec.num_image_tokens = spatial_layout->num_tokens();
  spec.keep_diagonal = keep_diagonal;
  spec.sink_blocks = sink_blocks;
  spec.keep_text = keep_text;
  spec.options = options;
  if (i2i_pattern_type) {
    SparseAttnConfig inner = *this;
    inner.pattern_type = *i2i_pattern_type;
    inner.i2i_pattern_type.reset();
    spec.i2i_pattern = std::make_shared<const PatternSpec>(inner.to_pattern_spec());
  }
  spec.composite_op = composite_op == "intersection" ? CompositeOp::kIntersection : CompositeOp::kUnion;
  for (const std::string& child : children) {
    SparseAttnConfig inner = *this;
    inner.pattern_type = child;
    inner.children.clear();
    spec.children.push_back(inner.to_pattern_spec());
  }
  return spec;
}

std::string SparseAttnConfig::to_json() const {
  json j;
  j["backend"] = backend;
  j["pattern_type"] = pattern_type;
  j["topk_ratio"] = topk_ratio;
  j["block_size_q"] = block_size_q;
  j["block_size_kv"] = block_size_kv;
  j["window_size"] = window_size ? json(*window_size) : json(nullptr);
  j["spatial_radius"] = spatial_radius ? json(*spatial_radius) : json(nullptr);
  j["schedule"] = schedule;
  j["dense_timesteps"] = dense_timesteps;
  j["dense_layers"] = dense_layers;
  j["decay_factor"] = decay_factor;
  j["local_window_size"] = local_window_size;
  j["threshold"] = threshold;
  j["stride"] = stride;
  if (spatial_layout) {
    j["spatial_layout"] = {{"frames", spatial_layout->frames},
                           {"height", spatial_layout->height},
                           {"width", spatial_layout->width},
                           {"patch_size", spatial_layout->patch_size},
                           {"ordering", std::string(spatial_ordering_name(spatial_layout->ordering))}};
  } else {
    j["spatial_layout"] = nullptr;
  }
  j["num_text_tokens"] = num_text_tokens ? json(*num_text_tokens) : json(nullptr);
  j["keep_diagonal"] = keep_diagonal;
  j["sink_blocks"] = sink_blocks;
  j["keep_text"] = keep_text;
  j["i2i_pattern_type"] = i2i_pattern_type ? json(*i2i_pattern_type) : json(nullptr);
  j["children"] = children;
  j["composite_op"] = composite_op;
  j["options"] = options;
  return j.dump();
}

SparseAttnConfig parse_sparse_attn_json(const std::string& json_text, const SparseAttnConfig& base) {
  const json parsed = parse_json_limited(json_text, kConfigJsonLimits, "sparse_attn config");
  if (!parsed.is_object()) fail_argument("sparse_attn config", "a JSON object", std::string(parsed.type_name()));
  SparseAttnConfig config = base;
  for (const auto& [key, value] : parsed.items()) {
    const auto it = setters().find(key);
    if (it == setters().end()) {
      const std::string shown = key.size() <= 60 ? key : key.substr(0, 60) + "... (" + std::to_string(key.size()) + " bytes)";
      fail_argument(field(shown), "a known key (" + known_keys() + ")", "unknown key");
    }
    it->second(config, value);
  }
  config.validate();
  return config;
}

SparseAttnConfig parse_sparse_attn_config_arg(const std::string& arg, const SparseAttnConfig& base) {
  if (!arg.empty() && arg[0] == '@') {
    const std::string path = arg.substr(1);
    const std::string text = read_file(path);
    try {
      return parse_sparse_attn_json(text, base);
    } catch (const Error& e) {
      throw Error("config file " + quoted_excerpt(path, 200) + ": " + e.what());
    }
  }
  return parse_sparse_attn_json(arg, base);
}

bool SparseAttnFlags::any() const {
  return backend || topk || schedule || pattern || config || env_value("TESSEL_SPARSE_ATTN_CONFIG") ||
         env_value("TESSEL_SPARSE_ATTN_BACKEND");
}

SparseAttnConfig SparseAttnFlags::to_config() const {
  SparseAttnConfig result;
  if (config) {
    result = parse_sparse_attn_config_arg(*config);
  } else if (const auto env = env_value("TESSEL_SPARSE_ATTN_CONFIG")) {
    result = parse_sparse_attn_config_arg(*env);
  }
  if (backend) {
    if (backend->empty()) fail_argument("--sparse-attn-backend", "a backend name, a plugin path, 'auto' or 'none'", "''");
    result.backend = *backend;
  }
  if (topk) {
    if (!(*topk > 0.0 && *topk <= 1.0)) fail_argument("--sparse-attn-topk (topk_ratio)", "a number in (0, 1]", *topk);
    result.topk_ratio = *topk;
  }
  if (schedule) result.schedule = *schedule;
  if (pattern) result.pattern_type = *pattern;
  result.validate();
  return result;
}

}  // namespace tessel
