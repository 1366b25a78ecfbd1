#include "tessel/sparse/pattern_backends.h"

#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/sparse/builtin_backends.h"
#include "tessel/sparse/estimators/device_mask_estimation.h"
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

std::vector<double> option_list(const PatternSpec& spec, const std::string& key) {
  std::vector<double> values;
  const std::string text = spec.option(key);
  size_t start = 0;
  while (start < text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    try {
      size_t used = 0;
      values.push_back(std::stod(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      fail_argument("pattern.options." + key, "comma-separated numbers", text);
    }
    start = comma + 1;
  }
  return values;
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
  PlannedMask out{plan->mask, {}, {}};
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

// ---- the device estimators (device_mask_estimation.h) behind the same backends ----------------
// Their limits are checked at plan time, naming the option; the always-keep options are passed to
// the estimator, since the host-side union does not run on the device path.

void check_device_common(const PatternSpec& spec, const AttentionShape& shape, const std::string& backend) {
  const std::string who = "backend '" + backend + "' on CUDA: ";
  if (shape.dtype != DType::kBF16 && shape.dtype != DType::kF16)
    fail_argument(who + "dtype", "bf16 or fp16", dtype_name(shape.dtype));
  if (spec.keep_text && spec.num_text_tokens.value_or(0) > 0)
    fail_argument(who + "pattern.keep_text", "false (the device estimators have no token layout)", "true");
}

void check_topk_device(const PatternSpec& spec, const AttentionShape& shape) {
  check_device_common(spec, shape, "dynamic_topk");
  const TopkEstimatorOptions o = topk_options_from_spec(spec);
  if (!o.per_head.empty())
    fail_argument("backend 'dynamic_topk' on CUDA: pattern.options.per_head", "empty (one ratio for all heads on CUDA)",
                  spec.option("per_head"));
}

void estimate_topk_device(const ExecContext& ctx, const TensorView& q, const TensorView& k, const PatternSpec& spec,
                          const StepInfo& step, DeviceEstimatedMask& mask) {
  TopkEstimatorOptions o = topk_options_for_step(spec, step);
  o.keep.diagonal = spec.keep_diagonal;
  o.keep.sink_blocks = spec.sink_blocks;
  estimate_topk_mask_device(ctx, q, k, o, mask);
}

void check_xattention_device(const PatternSpec& spec, const AttentionShape& shape) {
  check_device_common(spec, shape, "threshold");
  const std::string who = "backend 'threshold' on CUDA: ";
  const XAttentionOptions o = xattention_options_from_spec(spec);
  if (o.vote != XAttentionVote::kNone)
    fail_argument(who + "pattern.options.vote", "none (the voted masks are CPU-only)", spec.option("vote"));
  if (o.gqa_any) fail_argument(who + "pattern.options.gqa_any", "false (the aggregated mask is CPU-only)", "true");
  if (!o.per_head_threshold.empty())
    fail_argument(who + "pattern.options.per_head_threshold", "empty (one threshold for all heads on CUDA)",
                  spec.option("per_head_threshold"));
  const int64_t s = o.stride, d = shape.head_dim;
  if (const char* limit = xattention_device_limit(d, s, o.block_q, o.block_kv))
    fail_argument(who + "pattern.stride with head_dim and block sizes", limit,
                  detail::concat("stride ", s, ", head dim ", d, ", blocks ", o.block_q, "x", o.block_kv));
  if (!(o.threshold > 0.0 && o.threshold <= 1.0)) fail_argument(who + "pattern.threshold", "in (0, 1]", o.threshold);
  // The estimator forces the diagonal and block 0 before the threshold cut; the spec's
  // always-keep blocks must be among those forced blocks.
  if (spec.keep_diagonal && !o.keep_diagonal)
    fail_argument(who + "pattern.keep_diagonal with options.keep_diagonal = false", "options.keep_diagonal = true", "false");
  if (spec.sink_blocks > 1 || (spec.sink_blocks == 1 && !o.keep_first))
    fail_argument(who + "pattern.sink_blocks", "0, or 1 with options.keep_first = true",
                  detail::concat(spec.sink_blocks, o.keep_first ? "" : " with keep_first = false"));
}

void estimate_xattention_device(const ExecContext& ctx, const TensorView& q, const TensorView& k, const PatternSpec& spec,
                                const StepInfo&, DeviceEstimatedMask& mask) {
  estimate_xattention_mask_device(ctx, q, k, xattention_options_from_spec(spec), mask);
}

std::shared_ptr<Backend> dynamic_backend(const std::string& name, PatternType type) {
  PatternBackendInfo info;
  info.name = name;
  info.patterns = {type};
  if (type == PatternType::kDynamicTopk)
    return make_mask_estimating_backend(
        std::move(info),
        [](const ExecContext& ctx, const TensorView& q, const TensorView& k, const PatternSpec& spec,
           const StepInfo& step, const AttentionShape&) {
          return estimate_topk_mask(ctx, q, k, topk_options_for_step(spec, step)).mask;
        },
        DeviceMaskEstimator{check_topk_device, estimate_topk_device});
  return make_mask_estimating_backend(
      std::move(info),
      [](const ExecContext& ctx, const TensorView& q, const TensorView& k, const PatternSpec& spec, const StepInfo&,
         const AttentionShape&) {
        return estimate_xattention_mask(ctx, q, k, xattention_options_from_spec(spec)).mask;
      },
      DeviceMaskEstimator{check_xattention_device, estimate_xattention_device});
}

}  // namespace

void register_pattern_backends(BackendRegistry& registry) {
  registry.register_backend(static_backend("sliding_window", PatternType::kSlidingWindow));
  registry.register_backend(static_backend("spatial_aware", PatternType::kSpatialAware));
  registry.register_backend(static_backend("radial", PatternType::kRadial));
  registry.register_backend(static_backend("local", PatternType::kLocal));
  registry.register_backend(static_backend("arrow", PatternType::kArrow));
  registry.register_backend(static_backend("composite", PatternType::kComposite));
  registry.register_backend(dynamic_backend("dynamic_topk", PatternType::kDynamicTopk));
  registry.register_backend(dynamic_backend("threshold", PatternType::kThreshold));
}

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
  o.per_head = option_list(spec, "per_head");
  o.block_q = spec.block_q;
  o.block_kv = spec.block_kv;
  o.smooth_k = option_bool(spec, "smooth_k", o.smooth_k);
  const std::string rule = spec.option("rule", "spargeattn");
  if (rule == "spargeattn") o.rule = TopkRule::kSpargeAttn;
  else if (rule == "reach_target") o.rule = TopkRule::kReachTarget;
  else fail_argument("pattern.options.rule", "spargeattn or reach_target", rule);
  return o;
}

TopkEstimatorOptions topk_options_for_step(const PatternSpec& spec, const StepInfo& step) {
  TopkEstimatorOptions o = topk_options_from_spec(spec);
  if (step.density) o.topk_ratio = *step.density;
  return o;
}

XAttentionOptions xattention_options_from_spec(const PatternSpec& spec) {
  XAttentionOptions o;
  o.threshold = spec.threshold.value_or(0.95);
  o.stride = spec.stride.value_or(8);
  o.block_q = spec.block_q;
  o.block_kv = spec.block_kv;
  o.per_head_threshold = option_list(spec, "per_head_threshold");
  o.gqa_any = option_bool(spec, "gqa_any", false);
  o.keep_diagonal = option_bool(spec, "keep_diagonal", true);
  o.keep_first = option_bool(spec, "keep_first", true);
  const std::string vote = spec.option("vote", "none");
  if (vote == "none") o.vote = XAttentionVote::kNone;
  else if (vote == "heads") o.vote = XAttentionVote::kHeads;
  else if (vote == "columns") o.vote = XAttentionVote::kColumns;
  else fail_argument("pattern.options.vote", "none, heads or columns", vote);
  const std::string padding = spec.option("padding", "chunk");
  if (padding == "chunk") o.padding = XAttentionPadding::kChunk;
  else if (padding == "none") o.padding = XAttentionPadding::kNone;
  else fail_argument("pattern.options.padding", "chunk or none", padding);
  return o;
}

}  // namespace tessel
