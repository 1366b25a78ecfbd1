#include "tessel/sparse/config.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessel/core/error.h"
#include "tessel/core/io/limited_json.h"
#include "tessel/sparse/schedule.h"

namespace tessel {
namespace {

using nlohmann::json;

// A config is a few hundred bytes, a few levels deep ({"section": {"options": {"key": value}}});
// these limits leave room for any real one and refuse hostile text before values are built.
constexpr JsonLimits kConfigJsonLimits{1 << 20, 16};

std::string key_path(const std::string& path) { return "sparse_attn." + path; }

// A key as the user spelled it, cut short when hostile.
std::string shown_key(const std::string& key) {
  return key.size() <= 60 ? key : key.substr(0, 60) + "... (" + std::to_string(key.size()) + " bytes)";
}

[[noreturn]] void fail_type(const std::string& path, const std::string& expected, const json& value) {
  fail_argument(key_path(shown_key(path)), expected, std::string(value.type_name()) + " " + json_excerpt(value));
}

// ---- reading and writing one value of each type the schema uses -----------------------------

// What a JSON value must be to read as the scalar T, and how an error says so.
template <typename T>
struct Scalar;
template <>
struct Scalar<int64_t> {
  // Every integer of the config is a size, count or token position, and those are int32 in masks;
  // integers above INT64_MAX arrive as unsigned and would wrap.
  static bool accepts(const json& value) {
    if (!value.is_number_integer()) return false;
    if (value.is_number_unsigned()) return value.get<uint64_t>() <= static_cast<uint64_t>(INT32_MAX);
    return value.get<int64_t>() >= INT32_MIN && value.get<int64_t>() <= INT32_MAX;
  }
  static constexpr const char* kExpected = "an integer of magnitude below 2^31";
};
template <>
struct Scalar<double> {
  static bool accepts(const json& value) { return value.is_number(); }
  static constexpr const char* kExpected = "a number";
};
template <>
struct Scalar<bool> {
  static bool accepts(const json& value) { return value.is_boolean(); }
  static constexpr const char* kExpected = "true or false";
};
template <>
struct Scalar<std::string> {
  static bool accepts(const json& value) { return value.is_string(); }
  static constexpr const char* kExpected = "a string";
};

// Scalars; the specializations below cover the other types.
template <typename T>
struct Codec {
  static T read(const json& value, const std::string& path) {
    if (!Scalar<T>::accepts(value)) fail_type(path, Scalar<T>::kExpected, value);
    return value.get<T>();
  }
  static json write(const T& value) { return value; }
};

// Named enumerations: parse_name throws "<name>: expected one of ..., got ..."; the key path
// replaces its argument name.
template <typename Enum, Enum (*parse_name)(std::string_view), std::string_view (*name_of)(Enum)>
struct NamedCodec {
  static Enum read(const json& value, const std::string& path) {
    const std::string name = Codec<std::string>::read(value, path);
    try {
      return parse_name(name);
    } catch (const Error& e) {
      const std::string message = e.what();
      const size_t expected = message.find(": expected");
      throw Error(key_path(path) + (expected == std::string::npos ? ": " + message : message.substr(expected)));
    }
  }
  static json write(Enum value) { return std::string(name_of(value)); }
};
template <>
struct Codec<PatternType> : NamedCodec<PatternType, parse_pattern_type, pattern_type_name> {};
template <>
struct Codec<CompositeOp> : NamedCodec<CompositeOp, parse_composite_op, composite_op_name> {};
template <>
struct Codec<SpatialOrdering> : NamedCodec<SpatialOrdering, parse_spatial_ordering, spatial_ordering_name> {};

template <>
struct Codec<SpatialLayout> {
  static SpatialLayout read(const json& value, const std::string& path) {
    if (!value.is_object()) fail_type(path, "an object {frames, height, width, patch_size, ordering}", value);
    SpatialLayout layout;
    for (const auto& [key, item] : value.items()) {
      const std::string item_path = path + "." + key;
      if (key == "frames") layout.frames = Codec<int64_t>::read(item, item_path);
      else if (key == "height") layout.height = Codec<int64_t>::read(item, item_path);
      else if (key == "width") layout.width = Codec<int64_t>::read(item, item_path);
      else if (key == "patch_size") layout.patch_size = Codec<int64_t>::read(item, item_path);
      else if (key == "ordering") layout.ordering = Codec<SpatialOrdering>::read(item, item_path);
      else fail_argument(key_path(item_path), "one of frames, height, width, patch_size, ordering", "unknown key");
    }
    return layout;
  }
  static json write(const SpatialLayout& layout) {
    return {{"frames", layout.frames},
            {"height", layout.height},
            {"width", layout.width},
            {"patch_size", layout.patch_size},
            {"ordering", Codec<SpatialOrdering>::write(layout.ordering)}};
  }
};

// null <-> absent.
template <typename T>
struct Codec<std::optional<T>> {
  static std::optional<T> read(const json& value, const std::string& path) {
    if (value.is_null()) return std::nullopt;
    return Codec<T>::read(value, path);
  }
  static json write(const std::optional<T>& value) { return value ? Codec<T>::write(*value) : json(nullptr); }
};

template <typename T>
struct Codec<std::vector<T>> {
  static std::vector<T> read(const json& value, const std::string& path) {
    if (!value.is_array()) fail_type(path, "an array", value);
    std::vector<T> out;
    for (size_t i = 0; i < value.size(); ++i) out.push_back(Codec<T>::read(value[i], path + "[" + std::to_string(i) + "]"));
    return out;
  }
  static json write(const std::vector<T>& values) {
    json out = json::array();
    for (const T& value : values) out.push_back(Codec<T>::write(value));
    return out;
  }
};

// Backend options: any scalar, kept as its text.
template <>
struct Codec<std::map<std::string, std::string>> {
  static std::map<std::string, std::string> read(const json& value, const std::string& path) {
    if (!value.is_object()) fail_type(path, "an object of key: value", value);
    std::map<std::string, std::string> out;
    for (const auto& [key, item] : value.items()) {
      if (item.is_string()) out[key] = item.get<std::string>();
      else if (item.is_number() || item.is_boolean()) out[key] = item.dump();
      else fail_type(path + "." + key, "a string, number or boolean", item);
    }
    return out;
  }
  static json write(const std::map<std::string, std::string>& options) { return options; }
};

// ---- range checks ----------------------------------------------------------------------------

struct IntRange {
  int64_t low;
  std::optional<int64_t> high;  // none: unbounded
  void operator()(int64_t value, const std::string& path) const {
    if (value >= low && (!high || value <= *high)) return;
    const std::string expected = high ? "an integer in [" + std::to_string(low) + ", " + std::to_string(*high) + "]"
                                      : "an integer >= " + std::to_string(low);
    fail_argument(key_path(path), expected, value);
  }
};

// (low, high]: finite, above low, at most high.
struct OpenClosedRange {
  double low, high;
  void operator()(double value, const std::string& path) const {
    if (value > low && value <= high) return;
    fail_argument(key_path(path), detail::concat("a number in (", low, ", ", high, "]"), value);
  }
};

struct ValidLayout {
  void operator()(const SpatialLayout& layout, const std::string& path) const { layout.validate(key_path(path)); }
};

struct NoCheck {};

template <typename Check, typename T>
void apply_check(const Check& check, const T& value, const std::string& path) {
  if constexpr (!std::is_same_v<Check, NoCheck>) check(value, path);
}
template <typename Check, typename T>
void apply_check(const Check& check, const std::optional<T>& value, const std::string& path) {
  if (value) apply_check(check, *value, path);
}

// ---- the schema: every field once ------------------------------------------------------------

struct Field {
  std::string path;      // nested key path, e.g. "selection.topk_ratio"
  std::string flat_key;  // the older top-level key, e.g. "topk_ratio" ("" when it has none)
  std::function<void(SparseAttnConfig&, const json&, const std::string& spelled)> read;
  std::function<json(const SparseAttnConfig&)> write;
  std::function<void(const SparseAttnConfig&)> check;
};

// `access` is a generic lambda returning a reference to the member, for const and non-const configs.
template <typename Access, typename Check = NoCheck>
Field field(std::string path, std::string flat_key, Access access, Check check = {}) {
  using T = std::remove_cvref_t<decltype(access(std::declval<SparseAttnConfig&>()))>;
  Field f{path, std::move(flat_key), {}, {}, {}};
  f.read = [access](SparseAttnConfig& c, const json& value, const std::string& spelled) {
    access(c) = Codec<T>::read(value, spelled);
  };
  f.write = [access](const SparseAttnConfig& c) { return Codec<T>::write(access(c)); };
  f.check = [access, check, path](const SparseAttnConfig& c) { apply_check(check, access(c), path); };
  return f;
}

const std::vector<Field>& schema() {
  // clang-format off
  static const std::vector<Field> fields = {
      field("backend", "", [](auto& c) -> auto& { return c.backend; }),
      field("geometry.block_q", "block_size_q", [](auto& c) -> auto& { return c.geometry.block_q; },
            IntRange{1, kMaxConfigBlockSize}),
      field("geometry.block_kv", "block_size_kv", [](auto& c) -> auto& { return c.geometry.block_kv; },
            IntRange{1, kMaxConfigBlockSize}),
      field("geometry.spatial_layout", "spatial_layout", [](auto& c) -> auto& { return c.geometry.spatial_layout; },
            ValidLayout{}),
      field("geometry.num_text_tokens", "num_text_tokens", [](auto& c) -> auto& { return c.geometry.num_text_tokens; },
            IntRange{0, std::nullopt}),
      field("geometry.text_first", "text_first", [](auto& c) -> auto& { return c.geometry.text_first; }),
      field("pattern.type", "pattern_type", [](auto& c) -> auto& { return c.pattern.type; }),
      field("pattern.window_size", "window_size", [](auto& c) -> auto& { return c.pattern.window_size; },
            IntRange{0, std::nullopt}),
      field("pattern.spatial_radius", "spatial_radius", [](auto& c) -> auto& { return c.pattern.spatial_radius; },
            IntRange{0, std::nullopt}),
      field("pattern.decay_factor", "decay_factor", [](auto& c) -> auto& { return c.pattern.decay_factor; },
            OpenClosedRange{0.0, kMaxDecayFactor}),
      field("pattern.local_window_size", "local_window_size",
            [](auto& c) -> auto& { return c.pattern.local_window_size; }, IntRange{1, std::nullopt}),
      field("pattern.i2i_pattern", "i2i_pattern_type", [](auto& c) -> auto& { return c.pattern.i2i_pattern; }),
      field("pattern.children", "children", [](auto& c) -> auto& { return c.pattern.children; }),
      field("pattern.composite_op", "composite_op", [](auto& c) -> auto& { return c.pattern.composite_op; }),
      field("selection.topk_ratio", "topk_ratio", [](auto& c) -> auto& { return c.selection.topk_ratio; },
            OpenClosedRange{0.0, 1.0}),
      field("selection.threshold", "threshold", [](auto& c) -> auto& { return c.selection.threshold; },
            OpenClosedRange{0.0, 1.0}),
      field("selection.stride", "stride", [](auto& c) -> auto& { return c.selection.stride; },
            IntRange{1, kMaxStride}),
      field("selection.sink_blocks", "sink_blocks", [](auto& c) -> auto& { return c.selection.sink_blocks; },
            IntRange{0, std::nullopt}),
      field("selection.keep_diagonal", "keep_diagonal", [](auto& c) -> auto& { return c.selection.keep_diagonal; }),
      field("selection.keep_text", "keep_text", [](auto& c) -> auto& { return c.selection.keep_text; }),
      field("schedule", "", [](auto& c) -> auto& { return c.schedule; }),
      field("warmup.dense_steps", "dense_timesteps", [](auto& c) -> auto& { return c.warmup.dense_steps; },
            IntRange{0, std::nullopt}),
      field("warmup.dense_layers", "dense_layers", [](auto& c) -> auto& { return c.warmup.dense_layers; },
            IntRange{0, std::nullopt}),
      field("options", "", [](auto& c) -> auto& { return c.options; }),
  };
  // clang-format on
  return fields;
}

const std::vector<std::string>& section_names() {
  static const std::vector<std::string> names = {"geometry", "pattern", "selection", "warmup"};
  return names;
}

bool is_section(const std::string& key) {
  for (const std::string& name : section_names())
    if (name == key) return true;
  return false;
}

const Field* field_at(const std::string& path) {
  for (const Field& f : schema())
    if (f.path == path) return &f;
  return nullptr;
}

const Field* field_by_flat_key(const std::string& key) {
  for (const Field& f : schema())
    if (!f.flat_key.empty() && f.flat_key == key) return &f;
  return nullptr;
}

// The keys allowed under `section` ("" = the top level: sections, top-level fields, flat keys).
std::string allowed_keys(const std::string& section) {
  std::string out;
  const auto add = [&](const std::string& key) { out += (out.empty() ? "" : ", ") + key; };
  if (section.empty()) {
    for (const std::string& name : section_names()) add(name);
    for (const Field& f : schema())
      if (f.path.find('.') == std::string::npos) add(f.path);
    for (const Field& f : schema())
      if (!f.flat_key.empty()) add(f.flat_key);
    return out;
  }
  for (const Field& f : schema())
    if (f.path.starts_with(section + ".")) add(f.path.substr(section.size() + 1));
  return out;
}

std::string joined_schedule_names() {
  std::string names;
  for (const std::string& name : sparsity_schedule_names()) names += (names.empty() ? "" : ", ") + name;
  return names;
}

// The one place a config becomes a PatternSpec. Nested patterns are this config with the type
// replaced (and their own nesting removed).
PatternSpec derive_pattern_spec(const SparseAttnConfig& c) {
  PatternSpec spec;
  spec.type = c.pattern.type;
  spec.block_q = c.geometry.block_q;
  spec.block_kv = c.geometry.block_kv;
  spec.spatial_layout = c.geometry.spatial_layout;
  spec.num_text_tokens = c.geometry.num_text_tokens;
  if (c.geometry.spatial_layout && c.geometry.num_text_tokens)
    spec.num_image_tokens = c.geometry.spatial_layout->num_tokens();
  spec.text_first = c.geometry.text_first;
  spec.window_size = c.pattern.window_size;
  spec.spatial_radius = c.pattern.spatial_radius;
  spec.decay_factor = c.pattern.decay_factor;
  spec.local_window_frames = c.pattern.local_window_size;
  spec.topk_ratio = c.selection.topk_ratio;
  spec.threshold = c.selection.threshold;
  spec.stride = c.selection.stride;
  spec.keep_diagonal = c.selection.keep_diagonal;
  spec.sink_blocks = c.selection.sink_blocks;
  spec.keep_text = c.selection.keep_text;
  spec.options = c.options;
  if (c.pattern.i2i_pattern) {
    SparseAttnConfig inner = c;
    inner.pattern.type = *c.pattern.i2i_pattern;
    inner.pattern.i2i_pattern.reset();
    spec.i2i_pattern = std::make_shared<const PatternSpec>(derive_pattern_spec(inner));
  }
  spec.composite_op = c.pattern.composite_op;
  for (PatternType child : c.pattern.children) {
    SparseAttnConfig inner = c;
    inner.pattern.type = child;
    inner.pattern.children.clear();
    spec.children.push_back(derive_pattern_spec(inner));
  }
  return spec;
}

}  // namespace

void SparseAttnConfig::validate() const {
  if (backend.empty())
    fail_argument(key_path("backend"), "a backend name, a plugin path, 'auto' or 'none'", "''");
  for (const Field& f : schema()) f.check(*this);
  if (!has_sparsity_schedule(schedule))
    fail_argument(key_path("schedule"), "one of " + joined_schedule_names(), "'" + schedule + "'");
  if (selection.keep_text && !geometry.num_text_tokens)
    throw Error(key_path("selection.keep_text") + ": requires " + key_path("geometry.num_text_tokens") +
                ", which is not set");
  if (pattern.i2i_pattern == PatternType::kArrow)
    fail_argument(key_path("pattern.i2i_pattern"), "a pattern type other than arrow", "'arrow'");
  for (PatternType child : pattern.children)
    if (child == PatternType::kComposite)
      fail_argument(key_path("pattern.children"), "pattern types other than composite", "'composite'");
}

std::string SparseAttnConfig::to_json() const {
  json out = json::object();
  for (const Field& f : schema()) {
    std::string pointer = "/" + f.path;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    out[json::json_pointer(pointer)] = f.write(*this);
  }
  return out.dump();
}

SparseAttnConfig parse_sparse_attn_json(const std::string& json_text, const SparseAttnConfig& base) {
  // Syntax errors, numbers out of double's range, duplicate keys, oversized or too deeply nested text.
  const json parsed = parse_json_limited(json_text, kConfigJsonLimits, "sparse_attn config");
  if (!parsed.is_object()) fail_argument("sparse_attn config", "a JSON object", std::string(parsed.type_name()));

  SparseAttnConfig config = base;
  std::map<std::string, std::string> spelled_as;  // field path -> the key that set it
  const auto assign = [&](const Field& f, const json& value, const std::string& spelled) {
    const auto [it, first] = spelled_as.emplace(f.path, spelled);
    if (!first) throw Error(key_path(spelled) + ": given twice (also as " + key_path(it->second) + ")");
    f.read(config, value, spelled);
  };
  for (const auto& [key, value] : parsed.items()) {
    if (is_section(key)) {
      if (!value.is_object()) fail_type(key, "an object with keys " + allowed_keys(key), value);
      for (const auto& [sub_key, item] : value.items()) {
        const std::string path = key + "." + sub_key;
        const Field* f = field_at(path);
        if (f == nullptr) fail_argument(key_path(shown_key(path)), "a known key (" + allowed_keys(key) + ")", "unknown key");
        assign(*f, item, path);
      }
      continue;
    }
    const Field* f = key.find('.') == std::string::npos ? field_at(key) : nullptr;
    if (f == nullptr) f = field_by_flat_key(key);
    if (f == nullptr) fail_argument(key_path(shown_key(key)), "a known key (" + allowed_keys("") + ")", "unknown key");
    assign(*f, value, key);
  }
  return config;
}

ResolvedSparseAttnConfig::ResolvedSparseAttnConfig(SparseAttnConfig config) : config_(std::move(config)) {
  config_.validate();
  pattern_ = derive_pattern_spec(config_);
  json_ = config_.to_json();
}

}  // namespace tessel
