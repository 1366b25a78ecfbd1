// plan_static_pattern: evaluates a pattern's token rule for every query token of every q block
// (in parallel over q blocks) and ORs the kept key positions into that row's kv-block flags.
#include <algorithm>
#include <sstream>

#include "tessel/core/error.h"
#include "tessel/core/parallel.h"
#include "tessel/sparse/planners/static_patterns.h"
#include "token_rules.h"

namespace tessel {
namespace {

using planners::KeyMarker;
using planners::TokenRule;

struct PlanContext {
  TokenLayout layout;
  BlockMaskShape shape;          // one head
  const TokenPermutation* perm;  // null for raster order
};

// Arrow: text queries keep everything; image queries keep the text keys plus the inner rule.
class ArrowRule final : public TokenRule {
 public:
  ArrowRule(const TokenLayout& layout, std::unique_ptr<TokenRule> inner) : layout_(layout), inner_(std::move(inner)) {}
  void mark(int64_t i, KeyMarker& keys) const override {
    const int64_t t0 = layout_.text_offset(), t1 = t0 + layout_.text_tokens - 1;
    if (i >= t0 && i <= t1) {
      keys.range(0, layout_.seq_len() - 1);
      return;
    }
    keys.range(t0, t1);
    inner_->mark(i, keys);
  }

 private:
  TokenLayout layout_;
  std::unique_ptr<TokenRule> inner_;
};

std::unique_ptr<TokenRule> make_rule(const StaticPattern& pattern, const PlanContext& ctx) {
  if (const auto* arrow = std::get_if<ArrowPattern>(&pattern.rule)) {
    if (ctx.layout.text_tokens <= 0) fail_argument("arrow layout.text_tokens", "> 0", ctx.layout.text_tokens);
    if (!arrow->inner) fail_argument("arrow.inner", "a pattern", "null");
    if (std::holds_alternative<ArrowPattern>(arrow->inner->rule) || std::holds_alternative<CompositePattern>(arrow->inner->rule))
      fail_argument("arrow.inner", "a pattern other than arrow or composite", describe_static_pattern(*arrow->inner));
    return std::make_unique<ArrowRule>(ctx.layout, planners::make_token_rule(*arrow->inner, ctx.layout, ctx.shape.block_q));
  }
  return planners::make_token_rule(pattern, ctx.layout, ctx.shape.block_q);
}

// Dense (Qb × KVb) map of one pattern under the context's token order.
std::vector<uint8_t> plan_dense(const StaticPattern& pattern, const PlanContext& ctx) {
  const int64_t qbs = ctx.shape.q_blocks(), kvbs = ctx.shape.kv_blocks();
  std::vector<uint8_t> dense(static_cast<size_t>(qbs * kvbs), 0);
  if (const auto* comp = std::get_if<CompositePattern>(&pattern.rule)) {
    if (comp->children.empty()) fail_argument("composite.children", "at least one pattern", 0);
    for (size_t c = 0; c < comp->children.size(); ++c) {
      std::vector<uint8_t> child = plan_dense(comp->children[c], ctx);
      if (c == 0) {
        dense = std::move(child);
      } else if (comp->op == CompositeOp::kUnion) {
        for (size_t i = 0; i < dense.size(); ++i) dense[i] |= child[i];
      } else {
        for (size_t i = 0; i < dense.size(); ++i) dense[i] &= child[i];
      }
    }
    return dense;
  }
  std::unique_ptr<TokenRule> rule = make_rule(pattern, ctx);
  const int32_t* order = ctx.perm ? ctx.perm->order.data() : nullptr;
  const int32_t* inverse = ctx.perm ? ctx.perm->inverse.data() : nullptr;
  parallel_for(qbs, [&](int64_t qb) {
    const TokenLayout& l = ctx.layout;
    KeyMarker keys(dense.data() + qb * kvbs, ctx.shape.block_kv, inverse, l.image_offset(), l.image_offset() + l.grid.numel(),
                   l.grid.tokens_per_frame());
    const int64_t end = std::min(ctx.shape.seq_q, (qb + 1) * ctx.shape.block_q);
    for (int64_t p = qb * ctx.shape.block_q; p < end; ++p) rule->mark(order ? order[p] : p, keys);
  });
  return dense;
}

// The ordering a pattern needs: that of its spatial_aware parts (raster when none). Mixed
// orderings cannot share one token permutation.
void collect_orderings(const StaticPattern& pattern, std::vector<SpatialOrdering>& out) {
  if (const auto* p = std::get_if<SpatialAwarePattern>(&pattern.rule)) out.push_back(p->ordering);
  if (const auto* p = std::get_if<ArrowPattern>(&pattern.rule); p && p->inner) collect_orderings(*p->inner, out);
  if (const auto* p = std::get_if<CompositePattern>(&pattern.rule))
    for (const StaticPattern& child : p->children) collect_orderings(child, out);
}

}  // namespace

StaticPattern make_arrow(StaticPattern inner) {
  return StaticPattern{ArrowPattern{std::make_shared<const StaticPattern>(std::move(inner))}};
}

StaticPattern make_composite(CompositeOp op, std::vector<StaticPattern> children) {
  return StaticPattern{CompositePattern{op, std::move(children)}};
}

StaticPlan plan_static_pattern(const StaticPattern& pattern, const StaticPlanRequest& request) {
  return plan_static_pattern(std::vector<StaticPattern>{pattern}, request);
}

StaticPlan plan_static_pattern(const std::vector<StaticPattern>& per_head, const StaticPlanRequest& request) {
  validate_token_layout(request.layout, "request.layout");
  if (request.block_q < 1) fail_argument("request.block_q", ">= 1", request.block_q);
  if (request.block_kv < 1) fail_argument("request.block_kv", ">= 1", request.block_kv);
  if (per_head.empty()) fail_argument("per_head", "at least one pattern", 0);
  std::vector<SpatialOrdering> orderings;
  if (request.ordering) orderings.push_back(*request.ordering);
  for (const StaticPattern& p : per_head) collect_orderings(p, orderings);
  SpatialOrdering ordering = SpatialOrdering::kRaster;
  if (!orderings.empty()) {
    ordering = orderings.front();
    for (SpatialOrdering o : orderings)
      if (o != ordering)
        fail_argument("spatial_aware.ordering", detail::concat("one ordering for all heads and children (", spatial_ordering_name(ordering), ")"),
                      spatial_ordering_name(o));
  }
  StaticPlan plan;
  if (ordering != SpatialOrdering::kRaster) plan.permutation = make_token_permutation(request.layout, ordering);

  const int64_t seq = request.layout.seq_len();
  BlockMaskShape shape{1, 1, seq, seq, request.block_q, request.block_kv};
  PlanContext ctx{request.layout, shape, plan.permuted() ? &plan.permutation : nullptr};
  std::vector<uint8_t> dense;
  for (const StaticPattern& p : per_head) {
    std::vector<uint8_t> head = plan_dense(p, ctx);
    dense.insert(dense.end(), head.begin(), head.end());
  }
  shape.mask_heads = static_cast<int64_t>(per_head.size());
  apply_always_keep(shape, request.keep, &request.layout, dense);
  plan.mask = BlockMask::from_dense(shape, dense);
  return plan;
}

std::string describe_static_pattern(const StaticPattern& pattern) {
  std::ostringstream os;
  os.precision(17);  // distinct decay factors must give distinct cache keys
  std::visit(
      [&os](const auto& p) {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, DensePattern>) {
          os << "dense";
        } else if constexpr (std::is_same_v<T, SlidingWindowPattern>) {
          os << "sliding_window(window=" << p.window << ")";
        } else if constexpr (std::is_same_v<T, SlidingWindow3dPattern>) {
          os << "sliding_window_3d(f=" << p.frame_radius << ",h=" << p.height_radius << ",w=" << p.width_radius << ")";
        } else if constexpr (std::is_same_v<T, SpatialAwarePattern>) {
          os << "spatial_aware(r=" << p.radius << ",dims=" << p.dims << ",ordering=" << spatial_ordering_name(p.ordering) << ")";
        } else if constexpr (std::is_same_v<T, RadialPattern>) {
          os << "radial(decay=" << p.decay_factor << ",sink=" << p.frame0_sink << ")";
        } else if constexpr (std::is_same_v<T, LocalPattern>) {
          os << "local(window=" << p.local_window_size << ")";
        } else if constexpr (std::is_same_v<T, ArrowPattern>) {
          os << "arrow(" << (p.inner ? describe_static_pattern(*p.inner) : "null") << ")";
        } else {
          os << (p.op == CompositeOp::kUnion ? "union(" : "intersection(");
          for (size_t i = 0; i < p.children.size(); ++i) os << (i ? "," : "") << describe_static_pattern(p.children[i]);
          os << ")";
        }
      },
      pattern.rule);
  return os.str();
}

}  // namespace tessel
