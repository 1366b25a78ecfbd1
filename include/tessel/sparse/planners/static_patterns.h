// Static sparse patterns: block masks that depend only on shapes, planned once per shape (see
// plan_cache.h) and reused by every layer and step. Each pattern is a rule over token pairs
// (query position i, key position j) of a TokenLayout; a block (q block, kv block) is kept when
// at least one of its token pairs is kept ("rounded up to blocks"), so a block-sparse kernel
// never loses a pair the rule keeps. Exact rules, per pattern (docs/patterns.md has pictures):
//
// Positions: image token n of the grid has frame f = n / (H·W), row y = (n / W) % H, column
// x = n % W, and in-frame index p = n % (H·W). Text tokens (layout.text_tokens > 0) outside an
// arrow pattern attend only to text tokens (text↔text dense, text↔image none) unless
// AlwaysKeep::text widens them; arrow makes them global.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "tessel/sparse/block_mask.h"
#include "tessel/sparse/pattern.h"  // CompositeOp, SpatialOrdering
#include "tessel/sparse/planners/always_keep.h"
#include "tessel/sparse/planners/ordering.h"
#include "tessel/sparse/planners/token_layout.h"

namespace tessel {

struct StaticPattern;

// Every pair kept.
struct DensePattern {};

// 1-D sliding window over sequence positions (text included): keep iff |i - j| <= window.
struct SlidingWindowPattern {
  int64_t window = 256;
};

// 3-D window on the latent grid: keep iff |Δf| <= frame_radius, |Δy| <= height_radius and
// |Δx| <= width_radius (a box, raster order).
struct SlidingWindow3dPattern {
  int64_t frame_radius = 1;
  int64_t height_radius = 4;
  int64_t width_radius = 4;
};

// Neighbourhood of Chebyshev radius r in latent patches: dims = 2 keeps iff Δf = 0 and
// max(|Δy|, |Δx|) <= r; dims = 3 keeps iff max(|Δf|, |Δy|, |Δx|) <= r. Tokens are reordered by
// `ordering` first (see ordering.h); the plan carries that permutation.
struct SpatialAwarePattern {
  int64_t radius = 2;
  int dims = 3;
  SpatialOrdering ordering = SpatialOrdering::kHilbert;
};

// Radial Attention (Li et al. 2025), with T = H·W tokens per frame, B = block_q, d = |Δf|:
//   keep iff d <= 1, or (frame0_sink and key frame == 0), or the "far" rule holds:
//   g = bit_length(d); L0 = 2^bit_length(T) / 2^g; w = L0 · decay_factor;
//   width = w if w >= B else B; if L0 < B the frame pair is kept only when d % floor(B / L0) == 0;
//   keep iff |p_i - p_j| <= floor(width).
// The spatial window thus halves with every doubling of frame distance.
struct RadialPattern {
  double decay_factor = 1.0;
  bool frame0_sink = true;
};

// TeleFuser's local sparse attention: each query frame f attends to a window of exactly
// min(local_window_size, F) consecutive frames, [s, s + W - 1] with
// s = clamp(f - floor((W - 1) / 2), 0, F - W): centred, shifted inward at the ends.
struct LocalPattern {
  int64_t local_window_size = 6;
};

// MMDiT joint attention: text tokens attend to all tokens and all tokens attend to text
// tokens; image↔image pairs follow `inner` (which sees only the image grid). Needs
// layout.text_tokens > 0. inner may be any pattern but arrow.
struct ArrowPattern {
  std::shared_ptr<const StaticPattern> inner;
};

// Union or intersection of the children's block masks (all planned under one token order: the
// spatial_aware ordering of any child; two different orderings are an error).
struct CompositePattern {
  CompositeOp op = CompositeOp::kUnion;
  std::vector<StaticPattern> children;
};

struct StaticPattern {
  std::variant<DensePattern, SlidingWindowPattern, SlidingWindow3dPattern, SpatialAwarePattern, RadialPattern,
               LocalPattern, ArrowPattern, CompositePattern>
      rule;
};

struct StaticPlanRequest {
  TokenLayout layout;
  int64_t block_q = 128;
  int64_t block_kv = 64;
  AlwaysKeep keep;
  // The token order of the plan when set (the rules of every pattern are evaluated on the
  // original positions, so any pattern can be planned in any order); unset: the ordering of the
  // spatial_aware parts, raster when none. A spatial_aware part with another ordering is an error.
  std::optional<SpatialOrdering> ordering;
};

struct StaticPlan {
  BlockMask mask;                // over the (possibly permuted) sequence; mask_batch 1
  TokenPermutation permutation;  // empty when tokens stay in raster order
  bool permuted() const { return !permutation.order.empty(); }
};

// One pattern for all heads: mask_heads = 1.
StaticPlan plan_static_pattern(const StaticPattern& pattern, const StaticPlanRequest& request);
// One pattern per head (mask_heads = per_head.size()); all heads must share one token order.
StaticPlan plan_static_pattern(const std::vector<StaticPattern>& per_head, const StaticPlanRequest& request);

// Canonical text of a pattern, e.g. "radial(decay=1,sink=1)"; used as the plan-cache key.
std::string describe_static_pattern(const StaticPattern& pattern);

// Helpers that build the variant.
StaticPattern make_arrow(StaticPattern inner);
StaticPattern make_composite(CompositeOp op, std::vector<StaticPattern> children);

}  // namespace tessel
