#include "tessel/sparse/estimators/head_classifier.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "head_data.h"
#include "tessel/core/error.h"
#include "tessel/core/parallel.h"

namespace tessel {
namespace {

// Image tokens the probe samples: probe_rows evenly spaced over the grid (fewer for small grids),
// as grid indices (frame-major raster).
std::vector<int64_t> probe_positions(int64_t image_tokens, int64_t probe_rows) {
  const int64_t n = std::min(image_tokens, probe_rows);
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < n; ++r) rows.push_back((2 * r + 1) * image_tokens / (2 * n));
  return rows;
}

// What a key is to a sampled query: a text token; in its own frames, at its position (within
// temporal_radius) or not; in another frame, at its position within temporal_frame_radius
// frames (the temporal stripe) or not.
enum KeyRole : uint8_t { kText = 0, kOwnFramesNear = 1, kOwnFramesFar = 2, kStripe = 3, kOtherFrame = 4 };
constexpr int kNumRoles = 5;

}  // namespace

std::string_view head_class_name(HeadClass head_class) {
  switch (head_class) {
    case HeadClass::kSpatial: return "spatial";
    case HeadClass::kTemporal: return "temporal";
    case HeadClass::kTextural: return "textural";
  }
  return "textural";
}

void HeadClassifierOptions::validate() const {
  if (probe_rows < 1) fail_argument("head_classify.probe_rows", ">= 1", probe_rows);
  if (!(min_frame_mass > 0.0 && min_frame_mass <= 1.0))
    fail_argument("head_classify.min_frame_mass", "a value in (0, 1]", min_frame_mass);
  if (!(min_temporal_lift >= 1.0 && std::isfinite(min_temporal_lift)))
    fail_argument("head_classify.min_temporal_lift", "a finite value >= 1", min_temporal_lift);
  if (spatial_frame_radius < 0) fail_argument("head_classify.spatial_frame_radius", ">= 0", spatial_frame_radius);
  if (spatial_radius < 0) fail_argument("head_classify.spatial_radius", ">= 0", spatial_radius);
  if (temporal_radius < 0) fail_argument("head_classify.temporal_radius", ">= 0", temporal_radius);
  if (temporal_frame_radius < 0) fail_argument("head_classify.temporal_frame_radius", ">= 0", temporal_frame_radius);
  if (block_q < 1) fail_argument("head_classify.block_q", ">= 1", block_q);
  if (block_kv < 1) fail_argument("head_classify.block_kv", ">= 1", block_kv);
}

double HeadClassPlans::density(HeadClass head_class) const {
  const BlockMaskShape& s = plan.mask.shape();
  const int64_t row0 = static_cast<int64_t>(head_class) * s.q_blocks();
  const int64_t kept = plan.mask.indptr()[static_cast<size_t>(row0 + s.q_blocks())] - plan.mask.indptr()[static_cast<size_t>(row0)];
  return static_cast<double>(kept) / static_cast<double>(s.q_blocks() * s.kv_blocks());
}

HeadClassPlans plan_head_classes(const TokenLayout& layout, const HeadClassifierOptions& options) {
  options.validate();
  StaticPlanRequest request;
  request.layout = layout;
  request.block_q = options.block_q;
  request.block_kv = options.block_kv;
  request.ordering = options.ordering;
  const int64_t r_s = options.spatial_radius, r_t = options.temporal_radius;
  const std::vector<StaticPattern> per_class = {
      StaticPattern{SlidingWindow3dPattern{options.spatial_frame_radius, r_s, r_s}},
      StaticPattern{SlidingWindow3dPattern{options.temporal_frame_radius, r_t, r_t}},
      StaticPattern{DensePattern{}},
  };
  return HeadClassPlans{layout, plan_static_pattern(per_class, request)};
}

HeadProbe probe_head_classes(const ExecContext& ctx, const TensorView& q, const TensorView& k, const HeadClassPlans& plans,
                             const HeadClassifierOptions& options) {
  estimators::check_qk(q, k, "head_classify");
  options.validate();
  const TokenLayout& layout = plans.layout;
  const int64_t batch = q.size(0), seq = q.size(1), heads = q.size(2), kv_heads = k.size(2), dim = q.size(3);
  if (seq != layout.seq_len() || k.size(1) != layout.seq_len())
    fail_argument("head_classify q/k sequence", detail::concat(layout.seq_len(), " tokens (the layout's)"),
                  detail::concat(seq, " queries, ", k.size(1), " keys"));
  const TokenGrid& g = layout.grid;
  const int64_t first_image = layout.image_offset();
  const std::vector<int64_t> rows = probe_positions(g.numel(), options.probe_rows);
  const int64_t n = static_cast<int64_t>(rows.size());

  // role[r][j] for sampled row r and key j (sequence positions); rule_keys: the keys the
  // temporal rule keeps, summed over the sampled rows (its share of keys under uniform attention).
  std::vector<uint8_t> role(static_cast<size_t>(n * seq), kText);
  double rule_keys = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t i = rows[static_cast<size_t>(r)];
    const int64_t fi = i / g.tokens_per_frame(), yi = (i / g.width) % g.height, xi = i % g.width;
    for (int64_t t = 0; t < g.numel(); ++t) {
      const int64_t f = t / g.tokens_per_frame(), y = (t / g.width) % g.height, x = t % g.width;
      const bool near = std::abs(y - yi) <= options.temporal_radius && std::abs(x - xi) <= options.temporal_radius &&
                        std::abs(f - fi) <= options.temporal_frame_radius;
      uint8_t& out = role[static_cast<size_t>(r * seq + first_image + t)];
      if (std::abs(f - fi) <= options.spatial_frame_radius)
        out = near ? kOwnFramesNear : kOwnFramesFar;
      else
        out = near ? kStripe : kOtherFrame;
      rule_keys += out == kOwnFramesNear || out == kStripe;
    }
  }

  // mass[b][h][role]: summed over the sampled rows, each row's probabilities normalized.
  std::vector<double> mass(static_cast<size_t>(batch * heads * kNumRoles), 0.0);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  parallel_for(ctx.threads(), batch * heads, [&](int64_t bh, int) {
    const int64_t b = bh / heads, h = bh % heads;
    const std::vector<float> keys = estimators::head_rows(k, b, h / (heads / kv_heads), seq);
    const std::vector<float> queries = estimators::head_rows(q, b, h, seq);
    std::vector<double> p(static_cast<size_t>(seq));
    for (int64_t r = 0; r < n; ++r) {
      const float* qi = &queries[static_cast<size_t>((first_image + rows[static_cast<size_t>(r)]) * dim)];
      double max_logit = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < seq; ++j) {
        const float* kj = &keys[static_cast<size_t>(j * dim)];
        float dot = 0.0f;
        for (int64_t d = 0; d < dim; ++d) dot += qi[d] * kj[d];
        p[static_cast<size_t>(j)] = static_cast<double>(dot * scale);
        max_logit = std::max(max_logit, p[static_cast<size_t>(j)]);
      }
      double total = 0.0, by_role[kNumRoles] = {};
      for (int64_t j = 0; j < seq; ++j) {
        const double e = std::exp(p[static_cast<size_t>(j)] - max_logit);
        total += e;
        by_role[role[static_cast<size_t>(r * seq + j)]] += e;
      }
      for (int c = 0; c < kNumRoles; ++c) mass[static_cast<size_t>(bh * kNumRoles + c)] += by_role[c] / total;
    }
  });

  HeadProbe probe;
  for (int64_t h = 0; h < heads; ++h) {
    double by_role[kNumRoles] = {};
    for (int64_t b = 0; b < batch; ++b)
      for (int c = 0; c < kNumRoles; ++c) by_role[c] += mass[static_cast<size_t>((b * heads + h) * kNumRoles + c)];
    const double rows_probed = static_cast<double>(batch * n);
    const double frame_mass = (by_role[kOwnFramesNear] + by_role[kOwnFramesFar]) / rows_probed;
    const double temporal_recall = (by_role[kOwnFramesNear] + by_role[kStripe]) / rows_probed;
    const double temporal_lift = temporal_recall / (rule_keys / (static_cast<double>(n) * static_cast<double>(g.numel())));
    probe.frame_mass.push_back(frame_mass);
    probe.temporal_lift.push_back(temporal_lift);
    probe.classes.push_back(frame_mass >= options.min_frame_mass         ? HeadClass::kSpatial
                            : temporal_lift >= options.min_temporal_lift ? HeadClass::kTemporal
                                                                         : HeadClass::kTextural);
  }
  return probe;
}

BlockMask head_class_mask(const HeadClassPlans& plans, const std::vector<HeadClass>& classes) {
  const BlockMask& classes_mask = plans.plan.mask;
  BlockMaskShape shape = classes_mask.shape();
  shape.mask_heads = static_cast<int64_t>(classes.size());
  std::vector<std::vector<int32_t>> rows;
  rows.reserve(static_cast<size_t>(shape.num_rows()));
  for (HeadClass c : classes)
    for (int64_t qb = 0; qb < shape.q_blocks(); ++qb) rows.push_back(classes_mask.row(0, static_cast<int64_t>(c), qb));
  return BlockMask::from_rows(shape, rows);
}

}  // namespace tessel
