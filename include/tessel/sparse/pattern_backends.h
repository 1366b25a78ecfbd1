// The pattern library's backends, built on the mask-planning extension point (mask_planning.h)
// and registered with the other built-ins (register_builtin_backends in builtin_backends.h):
//
//   name             patterns                     how
//   sliding_window   sliding_window               1-D window (no spatial_layout: the block_sparse
//                                                 backend's planner) or 3-D box on the layout
//   spatial_aware    spatial_aware                radius box after the layout's ordering (permuted)
//   radial           radial                       Radial Attention mask
//   local            local                        TeleFuser local frames window
//   arrow            arrow                        MMDiT joint: text global, i2i_pattern inside
//   composite        composite                    union / intersection of children
//   dynamic_topk     dynamic_topk                 SpargeAttn-style estimator in every forward
//   threshold        threshold                    XAttention estimator in every forward
//   head_classify    head_classify                per-head class masks from a probe (RainFusion;
//                                                 CPU; estimators/head_classifier.h)
//
// Each is chosen by "auto" for its pattern (score 10), except sliding_window (score 0): auto keeps
// the block_sparse backend's 1-D window; name the backend to get the 3-D window.
// Static plans go through one process-wide StaticPlanCache, so layers and steps with the same
// shape share a plan. The translation from PatternSpec (exposed for `tessel mask`, `tessel eval`
// and tests) reads these backend options (PatternSpec::options, strings):
//   sliding_window (3-D): frame_radius (default 1), height_radius / width_radius (default
//                         spatial_radius, else 4)
//   spatial_aware: dims (2 or 3; default 3 when frames > 1, else 2)
//   radial: frame0_sink (true/false, default true)
//   dynamic_topk: cdf (> 0 selects cdf mode), similarity_threshold (default 0.1), per_head
//                 (comma-separated ratio or cdf value per query head)
//   threshold: gqa_any (true/false), vote (none | heads | columns), keep_diagonal, keep_first,
//              per_head_threshold (comma-separated tau per query head)
//   head_classify: probe_rows (64), min_frame_mass (0.7), min_temporal_lift (9),
//                  spatial_frame_radius (0), temporal_radius (1), temporal_frame_radius (2),
//                  ordering (hilbert), probe_interval (steps between probes, 5); spatial_radius
//                  is the spec's field
#pragma once

#include "tessel/sparse/backend.h"
#include "tessel/sparse/estimators/head_classifier.h"
#include "tessel/sparse/estimators/topk_estimator.h"
#include "tessel/sparse/estimators/xattention_estimator.h"
#include "tessel/sparse/planners/plan_cache.h"
#include "tessel/sparse/planners/static_patterns.h"
#include "tessel/sparse/registry.h"

namespace tessel {

// Registers the backends of the table above in `registry`, in that order.
void register_pattern_backends(BackendRegistry& registry);

// The token layout of a spec: spatial_layout's token grid plus num_text_tokens / text_first.
// Throws Error when the spec has no spatial_layout.
TokenLayout token_layout_from_spec(const PatternSpec& spec);
// The static pattern a spec describes (sliding_window needs a spatial_layout here). Throws Error
// for dynamic types.
StaticPattern static_pattern_from_spec(const PatternSpec& spec);
// Layout and block sizes; always-keep options are left to the backend (apply_always_keep).
StaticPlanRequest static_request_from_spec(const PatternSpec& spec);
TopkEstimatorOptions topk_options_from_spec(const PatternSpec& spec);
// The same with the step's scheduled density (when set) as the top-k ratio.
TopkEstimatorOptions topk_options_for_step(const PatternSpec& spec, const StepInfo& step);
XAttentionOptions xattention_options_from_spec(const PatternSpec& spec);
HeadClassifierOptions head_classifier_options_from_spec(const PatternSpec& spec);

// The head_classify backend (RainFusion head classification; CPU tensors).
std::shared_ptr<Backend> make_head_classify_backend();

// The process-wide plan cache the static backends use.
StaticPlanCache& static_plan_cache();

}  // namespace tessel
