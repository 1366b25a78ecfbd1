#include "tessel/sparse/pattern.h"

#include <array>
#include <cmath>
#include <string>

#include "enum_names.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {

using detail::join_names;
using detail::name_of;
using detail::parse_name;

constexpr std::array<std::string_view, kNumPatternTypes> kPatternNames = {
    "dense", "block_sparse", "sliding_window", "spatial_aware", "dynamic_topk",
    "threshold", "radial", "local", "arrow", "composite", "head_classify"};
constexpr std::array<std::string_view, 3> kOrderingNames = {"raster", "hilbert", "z_curve"};
constexpr std::array<std::string_view, 2> kCompositeOpNames = {"union", "intersection"};

void check_at_least(const std::string& field, int64_t value, int64_t minimum) {
  if (value < minimum) fail_argument(field, ">= " + std::to_string(minimum), value);
}

void check_ratio(const std::string& field, double value) {
  if (!(value > 0.0 && value <= 1.0)) fail_argument(field, "a value in (0, 1]", value);
}

void require(bool present, const std::string& field, PatternType type) {
  if (!present)
    throw Error(detail::concat(field, ": required by pattern_type ", pattern_type_name(type), ", but not set"));
}

}  // namespace

std::string_view pattern_type_name(PatternType type) { return name_of(kPatternNames, type); }
PatternType parse_pattern_type(std::string_view name) {
  return parse_name<PatternType>(kPatternNames, name, "pattern_type");
}

const std::vector<PatternType>& all_pattern_types() {
  static const std::vector<PatternType> types = detail::all_values<PatternType>(kPatternNames);
  return types;
}

std::string_view spatial_ordering_name(SpatialOrdering ordering) { return name_of(kOrderingNames, ordering); }
SpatialOrdering parse_spatial_ordering(std::string_view name) {
  return parse_name<SpatialOrdering>(kOrderingNames, name, "spatial_layout.ordering");
}

std::string_view composite_op_name(CompositeOp op) { return name_of(kCompositeOpNames, op); }
CompositeOp parse_composite_op(std::string_view name) {
  return parse_name<CompositeOp>(kCompositeOpNames, name, "composite_op");
}

void SpatialLayout::validate(const std::string& where) const {
  check_at_least(where + ".frames", frames, 1);
  check_at_least(where + ".height", height, 1);
  check_at_least(where + ".width", width, 1);
  check_at_least(where + ".patch_size", patch_size, 1);
  if (height % patch_size != 0)
    fail_argument(where + ".height", "a multiple of patch_size " + std::to_string(patch_size), height);
  if (width % patch_size != 0)
    fail_argument(where + ".width", "a multiple of patch_size " + std::to_string(patch_size), width);
  if (static_cast<size_t>(ordering) >= kOrderingNames.size())
    fail_argument(where + ".ordering", "one of " + join_names(kOrderingNames), static_cast<int>(ordering));
  // Token positions are int32 in block masks: refuse a layout with more tokens before num_tokens() overflows.
  constexpr int64_t kMaxTokens = (int64_t{1} << 31) - 1;
  const int64_t per_frame = (height / patch_size) * (width / patch_size);
  if (height > kMaxTokens || width > kMaxTokens || per_frame > kMaxTokens / frames)
    fail_argument(where, detail::concat("at most ", kMaxTokens, " tokens (frames x height x width / patch_size^2)"),
                  detail::concat(frames, "x", height, "x", width));
}

void PatternSpec::validate() const {
  if (static_cast<int>(type) >= kNumPatternTypes)
    fail_argument("pattern.type", "one of " + join_names(kPatternNames), static_cast<int>(type));
  check_at_least("pattern.block_q", block_q, 1);
  check_at_least("pattern.block_kv", block_kv, 1);
  if (block_mask) {
    const BlockMaskShape& s = block_mask->shape();
    if (s.block_q != block_q || s.block_kv != block_kv)
      fail_argument("pattern.block_mask", "block sizes " + std::to_string(block_q) + "x" + std::to_string(block_kv) +
                                              " (block_q x block_kv of the spec)",
                    std::to_string(s.block_q) + "x" + std::to_string(s.block_kv));
  }
  if (!sub_block_mask.empty()) {
    if (!block_mask) throw Error("pattern.sub_block_mask: requires pattern.block_mask, which is not set");
    const size_t expected = static_cast<size_t>(block_mask->nnz() * block_q * block_kv);
    if (sub_block_mask.size() != expected)
      fail_argument("pattern.sub_block_mask", std::to_string(expected) + " entries (nnz x block_q x block_kv)",
                    sub_block_mask.size());
  }
  if (window_size) check_at_least("pattern.window_size", *window_size, 0);
  if (spatial_layout) spatial_layout->validate("pattern.spatial_layout");
  if (spatial_radius) check_at_least("pattern.spatial_radius", *spatial_radius, 0);
  if (!(decay_factor > 0.0 && decay_factor <= kMaxDecayFactor))
    fail_argument("pattern.decay_factor", "a value in (0, " + detail::concat(kMaxDecayFactor) + "]", decay_factor);
  if (local_window_frames) check_at_least("pattern.local_window_frames", *local_window_frames, 1);
  if (topk_ratio) check_ratio("pattern.topk_ratio", *topk_ratio);
  if (threshold) check_ratio("pattern.threshold", *threshold);
  if (stride && (*stride < 1 || *stride > kMaxStride))
    fail_argument("pattern.stride", "a value in [1, " + std::to_string(kMaxStride) + "]", *stride);
  if (num_image_tokens) check_at_least("pattern.num_image_tokens", *num_image_tokens, 0);
  if (num_text_tokens) check_at_least("pattern.num_text_tokens", *num_text_tokens, 0);
  check_at_least("pattern.sink_blocks", sink_blocks, 0);
  if (keep_text && !num_text_tokens) throw Error("pattern.keep_text: requires pattern.num_text_tokens, which is not set");
  if (total_steps) check_at_least("pattern.total_steps", *total_steps, 1);
  if (current_step) {
    check_at_least("pattern.current_step", *current_step, 0);
    if (total_steps && *current_step >= *total_steps)
      fail_argument("pattern.current_step", "< total_steps (" + std::to_string(*total_steps) + ")", *current_step);
  }

  switch (type) {
    case PatternType::kDense: break;
    case PatternType::kBlockSparse: require(block_mask != nullptr, "pattern.block_mask", type); break;
    case PatternType::kSlidingWindow:
      require(window_size.has_value() || spatial_layout.has_value(), "pattern.window_size", type);
      break;
    case PatternType::kSpatialAware:
      require(spatial_layout.has_value(), "pattern.spatial_layout", type);
      require(spatial_radius.has_value(), "pattern.spatial_radius", type);
      break;
    case PatternType::kDynamicTopk: require(topk_ratio.has_value(), "pattern.topk_ratio", type); break;
    case PatternType::kThreshold: require(threshold.has_value(), "pattern.threshold", type); break;
    case PatternType::kRadial: require(spatial_layout.has_value(), "pattern.spatial_layout", type); break;
    case PatternType::kLocal:
      require(spatial_layout.has_value(), "pattern.spatial_layout", type);
      require(local_window_frames.has_value(), "pattern.local_window_frames", type);
      break;
    case PatternType::kArrow:
      require(num_text_tokens.has_value(), "pattern.num_text_tokens", type);
      require(num_image_tokens.has_value(), "pattern.num_image_tokens", type);
      require(i2i_pattern != nullptr, "pattern.i2i_pattern", type);
      break;
    case PatternType::kComposite: require(!children.empty(), "pattern.children", type); break;
    case PatternType::kHeadClassify: require(spatial_layout.has_value(), "pattern.spatial_layout", type); break;
  }
  if (i2i_pattern) {
    if (i2i_pattern->type == PatternType::kArrow)
      throw Error("pattern.i2i_pattern: expected a non-arrow pattern, got arrow");
    i2i_pattern->validate();
  }
  for (size_t i = 0; i < children.size(); ++i) {
    const PatternSpec& child = children[i];
    if (child.block_q != block_q || child.block_kv != block_kv)
      fail_argument("pattern.children[" + std::to_string(i) + "]",
                    "the parent's block sizes " + std::to_string(block_q) + "x" + std::to_string(block_kv),
                    std::to_string(child.block_q) + "x" + std::to_string(child.block_kv));
    child.validate();
  }
}

std::string PatternSpec::option(const std::string& key, const std::string& fallback) const {
  const auto it = options.find(key);
  return it == options.end() ? fallback : it->second;
}

}  // namespace tessel
