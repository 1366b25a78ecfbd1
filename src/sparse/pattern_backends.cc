#include "tessel/sparse/pattern_backends.h"

#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/sparse/builtin_backends.h"
#include "tessel/sparse/mask_planning.h"
#include "tessel/sparse/planners/plan_cache.h"
#include "tessel/sparse/registry.h"

namespace tessel {
namespace {

double option_double(const PatternSpec& spec, const std::string& key, double fallback) {
  const std::string text = spec.option(key);
  if (text.empty()) return fallback;
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  fail_argument("pattern.options." + key, "a number", text);
}

int64_t option_int(const PatternSpec& spec, const std::string& key, int64_t fallback) {
  const std::string text = spec.option(key);
  if (text.empty()) return fallback;
  try {
    size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  fail_argument("pattern.options." + key, "an integer", text);
}

bool option_bool(const PatternSpec& spec, const std::string& key, bool fallback) {
  const std::string text = spec.option(key);
  if (text.empty()) return fallback;
  if (text == "true" || text == "1") return true;
  if (text == "false" || text == "0") return false;
  fail_argument("pattern.options." + key, "true or false", text);
}

// Static backends attend within one sequence laid out as the spec says.
void check_self_attention(const PatternSpec& spec, const AttentionShape& shape, const std::string& backend) {
  const int64_t seq = token_layout_from_spec(spec).seq_len();
  if (shape.seq_q != seq || shape.seq_kv != seq)
    fail_argument("backend '" + backend + "' sequence lengths",
                  detail::concat("seq_q = seq_kv = ", seq, " (the spatial_layout's tokens plus num_text_tokens)"),
                  detail::concat("seq_q ", shape.seq_q, ", seq_kv ", shape.seq_kv));
}

PlannedMask plan_static(const PatternSpec& spec, ModuleType, const AttentionShape& shape, const std::string& backend) {
  check_self_attention(spec, shape, backend);
  const std::shared_ptr<const StaticPlan> plan = static_plan_cache().get(static_pattern_from_spec(spec), static_request_from_spec(spec));
  PlannedMask out{plan->mask, {}};
  out.permutation.assign(plan->permutation.order.begin(), plan->permutation.order.end());
  return out;
}

std::shared_ptr<Backend> static_backend(const std::string& name, PatternType type) {
  PatternBackendInfo info;
  info.name = name;
  info.patterns = {type};
  // "auto" keeps resolving sliding_window to the block_sparse backend (score 1) and to plugins;
  // the 3-D window is chosen by name (--sparse-attn-backend sliding_window).
  if (type == PatternType::kSlidingWindow) info.score = 0;
  return make_mask_planning_backend(std::move(info), [name, type](const PatternSpec& spec, ModuleType module, const AttentionShape& shape) {
    if (type == PatternType::kSlidingWindow && !spec.spatial_layout) return plan_sliding_window_blocks(spec, module, shape);
    return plan_static(spec, module, shape, name);
  });
}

std::shared_ptr<Backend> dynamic_backend(const std::string& name, PatternType type) {
  PatternBackendInfo info;
  info.name = name;
  info.patterns = {type};
  info.devices = {DeviceType::kCPU};  // the CUDA estimators live with the CUDA kernels
  if (type == PatternType::kDynamicTopk)
    return make_mask_estimating_backend(std::move(info), [](const TensorView& q, const TensorView& k, const PatternSpec& spec,
                                                            const AttentionShape&) {
      return estimate_topk_mask(q, k, topk_options_from_spec(spec)).mask;
    });
  return make_mask_estimating_backend(std::move(info), [](const TensorView& q, const TensorView& k, const PatternSpec& spec,
                                                          const AttentionShape&) {
    return estimate_xattention_mask(q, k, xattention_options_from_spec(spec)).mask;
  });
}

BuiltinBackendRegistration sliding_window_registration{[] { return static_backend("sliding_window", PatternType::kSlidingWindow); }};
BuiltinBackendRegistration spatial_aware_registration{[] { return static_backend("spatial_aware", PatternType::kSpatialAware); }};
BuiltinBackendRegistration radial_registration{[] { return static_backend("radial", PatternType::kRadial); }};
BuiltinBackendRegistration local_registration{[] { return static_backend("local", PatternType::kLocal); }};
BuiltinBackendRegistration arrow_registration{[] { return static_backend("arrow", PatternType::kArrow); }};
BuiltinBackendRegistration composite_registration{[] { return static_backend("composite", PatternType::kComposite); }};
BuiltinBackendRegistration topk_registration{[] { return dynamic_backend("dynamic_topk", PatternType::kDynamicTopk); }};
BuiltinBackendRegistration threshold_registration{[] { return dynamic_backend("threshold", PatternType::kThreshold); }};

}  // namespace

StaticPlanCache& static_plan_cache() {
  static StaticPlanCache cache;
  return cache;
}

TokenLayout token_layout_from_spec(const PatternSpec& spec) {
  if (!spec.spatial_layout)
    fail_argument("pattern.spatial_layout", detail::concat("a layout (needed by pattern ", pattern_type_name(spec.type), ")"), "none");
  const SpatialLayout& s = *spec.spatial_layout;
  s.validate("pattern.spatial_layout");
  TokenLayout layout;
  layout.grid = TokenGrid{s.frames, s.grid_height(), s.grid_width()};
  layout.text_tokens = spec.num_text_tokens.value_or(0);
  layout.text_first = spec.text_first;
  return layout;
}

StaticPattern static_pattern_from_spec(const PatternSpec& spec) {
  switch (spec.type) {
    case PatternType::kDense: return StaticPattern{DensePattern{}};
    case PatternType::kSlidingWindow: {
      if (!spec.spatial_layout) return StaticPattern{SlidingWindowPattern{spec.window_size.value_or(0)}};
      const int64_t r = spec.spatial_radius.value_or(4);
      return StaticPattern{SlidingWindow3dPattern{option_int(spec, "frame_radius", 1), option_int(spec, "height_radius", r),
                                                  option_int(spec, "width_radius", r)}};
    }
    case PatternType::kSpatialAware: {
      const TokenLayout layout = token_layout_from_spec(spec);
      return StaticPattern{SpatialAwarePattern{spec.spatial_radius.value_or(1),
                                               static_cast<int>(option_int(spec, "dims", layout.grid.frames > 1 ? 3 : 2)),
                                               spec.spatial_layout->ordering}};
    }
    case PatternType::kRadial: return StaticPattern{RadialPattern{spec.decay_factor, option_bool(spec, "frame0_sink", true)}};
    case PatternType::kLocal: return StaticPattern{LocalPattern{spec.local_window_frames.value_or(6)}};
    case PatternType::kArrow: {
      if (!spec.i2i_pattern) fail_argument("pattern.i2i_pattern", "the image-to-image pattern of arrow", "none");
      PatternSpec inner = *spec.i2i_pattern;
      if (!inner.spatial_layout) inner.spatial_layout = spec.spatial_layout;
      return make_arrow(static_pattern_from_spec(inner));
    }
    case PatternType::kComposite: {
      std::vector<StaticPattern> children;
      for (PatternSpec child : spec.children) {
        if (!child.spatial_layout) child.spatial_layout = spec.spatial_layout;
        children.push_back(static_pattern_from_spec(child));
      }
      return make_composite(spec.composite_op, std::move(children));
    }
    default:
      fail_argument("pattern_type", "a static pattern (dense, sliding_window, spatial_aware, radial, local, arrow, composite)",
                    pattern_type_name(spec.type));
  }
}

StaticPlanRequest static_request_from_spec(const PatternSpec& spec) {
  StaticPlanRequest request;
  request.layout = token_layout_from_spec(spec);
  request.block_q = spec.block_q;
  request.block_kv = spec.block_kv;
  return request;
}

TopkEstimatorOptions topk_options_from_spec(const PatternSpec& spec) {
  TopkEstimatorOptions o;
  o.topk_ratio = spec.topk_ratio.value_or(0.5);
  o.cdf_threshold = option_double(spec, "cdf", 0.0);
  o.similarity_threshold = option_double(spec, "similarity_threshold", o.similarity_threshold);
  o.block_q = spec.block_q;
  o.block_kv = spec.block_kv;
  return o;
}

XAttentionOptions xattention_options_from_spec(const PatternSpec& spec) {
  XAttentionOptions o;
  o.threshold = spec.threshold.value_or(0.95);
  o.stride = spec.stride.value_or(8);
  o.block_q = spec.block_q;
  o.block_kv = spec.block_kv;
  o.gqa_any = option_bool(spec, "gqa_any", false);
  o.keep_diagonal = option_bool(spec, "keep_diagonal", true);
  o.keep_first = option_bool(spec, "keep_first", true);
  const std::string vote = spec.option("vote", "none");
  if (vote == "none") o.vote = XAttentionVote::kNone;
  else if (vote == "heads") o.vote = XAttentionVote::kHeads;
  else if (vote == "columns") o.vote = XAttentionVote::kColumns;
  else fail_argument("pattern.options.vote", "none, heads or columns", vote);
  return o;
}

}  // namespace tessel
