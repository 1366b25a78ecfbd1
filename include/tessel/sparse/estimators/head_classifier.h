// Head classification (RainFusion, Chen et al. 2025): each attention head of a video DiT is
// spatial (attends within its own frame), temporal (attends the same position across frames) or
// textural (attends broadly). A cheap probe decides which: a few sampled query tokens attend to
// all keys (exact softmax, fp32), and two statistics of those rows' attention, averaged over the
// sampled rows and the batch, classify the head:
//   frame_mass      — the probability mass on keys of the query's own frames (|Δf| <=
//                     spatial_frame_radius);
//   temporal_lift   — the probability mass on keys at the query's position (|Δy|, |Δx| <=
//                     temporal_radius) in nearby frames (|Δf| <= temporal_frame_radius), i.e.
//                     what the temporal pattern keeps per token, divided by the share of keys
//                     it keeps (what uniform attention would put there): scale-free, so larger
//                     frames, which spread the mass thinner, need no other threshold.
// spatial if frame_mass >= min_frame_mass; else temporal if temporal_lift >= min_temporal_lift;
// else textural. The statistics are token-level, so the classes do not depend on the block size.
//
// Each class executes its static pattern, planned once per layout in one token order
// (`ordering`, Hilbert by default, which packs both windows into few blocks: docs/patterns.md):
//   spatial  — 3-D window |Δf| <= spatial_frame_radius, |Δy|, |Δx| <= spatial_radius;
//   temporal — stripes over frames: |Δy|, |Δx| <= temporal_radius, |Δf| <= temporal_frame_radius;
//   textural — dense.
// Sampled query tokens: probe_rows image tokens evenly spaced over the grid (original order),
// image token floor((2k + 1) · N / (2 · probe_rows)) for k < probe_rows, N the grid's tokens.
// Text tokens (layout.text_tokens) are never sampled and count for neither statistic.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/sparse/pattern.h"
#include "tessel/sparse/planners/static_patterns.h"

namespace tessel {

enum class HeadClass : uint8_t { kSpatial, kTemporal, kTextural };
inline constexpr int kNumHeadClasses = 3;
std::string_view head_class_name(HeadClass head_class);  // "spatial", "temporal", "textural"

struct HeadClassifierOptions {
  int64_t probe_rows = 64;
  double min_frame_mass = 0.7;
  double min_temporal_lift = 9.0;
  int64_t spatial_frame_radius = 0;
  int64_t spatial_radius = 4;
  int64_t temporal_radius = 1;
  int64_t temporal_frame_radius = 2;
  SpatialOrdering ordering = SpatialOrdering::kHilbert;
  int64_t block_q = 128;
  int64_t block_kv = 64;

  void validate() const;  // throws Error naming the field
};

// The three class masks (mask_heads = 3, in HeadClass order) over one token order.
struct HeadClassPlans {
  TokenLayout layout;
  StaticPlan plan;
  // Kept-block count of each class mask over all of its blocks.
  double density(HeadClass head_class) const;
};
HeadClassPlans plan_head_classes(const TokenLayout& layout, const HeadClassifierOptions& options);

struct HeadProbe {
  std::vector<HeadClass> classes;    // per query head
  std::vector<double> frame_mass;    // per query head (see above)
  std::vector<double> temporal_lift;  // per query head
};

// Probes q (B, S, H_q, D) and k (B, S, H_kv, D) (CPU, fp32/fp16/bf16, S = the layout's tokens,
// original order) and classifies every query head. Runs on ctx.threads() threads.
HeadProbe probe_head_classes(const ExecContext& ctx, const TensorView& q, const TensorView& k, const HeadClassPlans& plans,
                             const HeadClassifierOptions& options);

// The per-head mask (mask_heads = classes.size(), permuted order) giving each head its class mask.
BlockMask head_class_mask(const HeadClassPlans& plans, const std::vector<HeadClass>& classes);

}  // namespace tessel
