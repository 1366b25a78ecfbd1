#include "tessel/sparse/pattern_backends.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "pattern_test_util.h"
#include "sparse/sparse_test_util.h"
#include "tessel/core/random.h"
#include "tessel/kernels/attention.h"
#include "tessel/sparse/config.h"
#include "tessel/sparse/registry.h"

namespace tessel {
namespace {

using testing::builtins;

// Tokens: 8 frames of 4x8 patches (latent 8x16, patch 2), 256 tokens.
SparseAttnConfig config_for(const std::string& pattern) {
  SparseAttnConfig c;
  c.pattern.type = parse_pattern_type(pattern);
  c.geometry.block_q = 32;
  c.geometry.block_kv = 16;
  c.geometry.spatial_layout = SpatialLayout{8, 8, 16, 2, SpatialOrdering::kRaster};
  c.pattern.spatial_radius = 2;
  c.pattern.local_window_size = 2;
  c.pattern.decay_factor = 0.5;
  c.selection.topk_ratio = 0.3;
  c.selection.threshold = 0.9;
  c.selection.stride = 8;
  return c;
}

PatternSpec spec_of(const SparseAttnConfig& c) { return ResolvedSparseAttnConfig(c).pattern(); }

struct Inputs {
  Tensor q, k, v, out, expected;
};

Inputs inputs(int64_t seq) {
  Inputs t{Tensor::empty({1, seq, 2, 32}, DType::kF32), Tensor::empty({1, seq, 2, 32}, DType::kF32),
           Tensor::empty({1, seq, 2, 32}, DType::kF32), Tensor::empty({1, seq, 2, 32}, DType::kF32),
           Tensor::empty({1, seq, 2, 32}, DType::kF32)};
  fill_normal(t.q.view(), 1);
  fill_normal(t.k.view(), 2);
  fill_normal(t.v.view(), 3);
  fill(t.out.view(), NAN);
  return t;
}

TEST(PatternBackends, EveryPatternIsRegisteredAndChosenByAuto) {
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"spatial_aware", "spatial_aware"}, {"radial", "radial"}, {"local", "local"},
      {"arrow", "arrow"},                   {"composite", "composite"},         {"dynamic_topk", "dynamic_topk"},
      {"threshold", "threshold"}};
  // sliding_window is chosen by name only (score 0: auto keeps block_sparse or a plugin).
  ASSERT_NE(builtins().find("sliding_window"), nullptr);
  EXPECT_EQ(builtins().find("sliding_window")->score(), 0);
  for (const auto& [pattern, backend] : expected) {
    ASSERT_NE(builtins().find(backend), nullptr) << backend;
    const Resolution r = builtins().resolve(ResolvedSparseAttnConfig(config_for(pattern)), ModuleType::kDitSelf, Device::cpu());
    ASSERT_NE(r.backend, nullptr) << pattern;
    EXPECT_EQ(r.backend->name(), backend) << pattern;
  }
}

TEST(PatternBackends, StaticBackendsRunTheirPlannedMask) {
  for (const std::string pattern : {"radial", "local", "sliding_window", "spatial_aware"}) {
    SparseAttnConfig c = config_for(pattern);
    if (pattern == "spatial_aware") c.geometry.spatial_layout->ordering = SpatialOrdering::kHilbert;
    const PatternSpec spec = spec_of(c);
    auto backend = builtins().get(pattern);
    Inputs t = inputs(256);
    const AttentionShape shape = AttentionShape::of(t.q.view(), t.k.view(), t.v.view());
    auto metadata = backend->make_metadata_builder()->plan(ExecContext{}, spec, ModuleType::kDitSelf, shape);
    ASSERT_NE(metadata->mask, nullptr);
    const StaticPlan plan = plan_static_pattern(static_pattern_from_spec(spec), static_request_from_spec(spec));
    EXPECT_EQ(metadata->mask->indices(), plan.mask.indices()) << pattern;
    EXPECT_LT(metadata->mask->density(), 1.0) << pattern;
    const ForwardStats stats = backend->make_impl()->forward(ExecContext{}, t.q.view(), t.k.view(), t.v.view(), *metadata, StepInfo{}, t.out.view(), TensorView{});
    EXPECT_NEAR(stats.density, metadata->mask->density(), 1e-12);
    // The same computation by hand: permute, block-sparse attention, unpermute.
    if (plan.permuted()) {
      Tensor qp = Tensor::empty(t.q.shape(), DType::kF32), kp = Tensor::empty(t.q.shape(), DType::kF32),
             vp = Tensor::empty(t.q.shape(), DType::kF32), op = Tensor::empty(t.q.shape(), DType::kF32);
      permute_tokens(t.q.view(), qp.view(), plan.permutation);
      permute_tokens(t.k.view(), kp.view(), plan.permutation);
      permute_tokens(t.v.view(), vp.view(), plan.permutation);
      block_sparse_attention_forward(ExecContext{}, qp.view(), kp.view(), vp.view(), plan.mask.view(), op.view(), TensorView{});
      unpermute_tokens(op.view(), t.expected.view(), plan.permutation);
    } else {
      block_sparse_attention_forward(ExecContext{}, t.q.view(), t.k.view(), t.v.view(), plan.mask.view(), t.expected.view(), TensorView{});
    }
    EXPECT_LT(testing::relative_l2(t.out.view(), t.expected.view()), 1e-6) << pattern;
  }
}

TEST(PatternBackends, ArrowAndCompositeFromConfig) {
  SparseAttnConfig c = config_for("arrow");
  c.geometry.num_text_tokens = 20;
  c.pattern.i2i_pattern = PatternType::kRadial;
  auto backend = builtins().get("arrow");
  Inputs t = inputs(276);
  auto metadata = backend->make_metadata_builder()->plan(ExecContext{}, spec_of(c), ModuleType::kDitJoint,
                                                         AttentionShape::of(t.q.view(), t.k.view(), t.v.view()));
  // Text rows (q block 0 holds the 20 text tokens) are full.
  EXPECT_EQ(metadata->mask->row(0, 0, 0).size(), static_cast<size_t>(metadata->mask->shape().kv_blocks()));
  backend->make_impl()->forward(ExecContext{}, t.q.view(), t.k.view(), t.v.view(), *metadata, StepInfo{}, t.out.view(), TensorView{});
  EXPECT_FALSE(std::isnan(t.out.data_as<float>()[0]));

  SparseAttnConfig comp = config_for("composite");
  comp.pattern.children = {PatternType::kRadial, PatternType::kLocal};
  comp.pattern.composite_op = CompositeOp::kIntersection;
  const PatternSpec spec = spec_of(comp);
  const double both = plan_static_pattern(static_pattern_from_spec(spec), static_request_from_spec(spec)).mask.density();
  const double radial = plan_static_pattern(static_pattern_from_spec(spec.children[0]), static_request_from_spec(spec)).mask.density();
  EXPECT_LE(both, radial);
}

TEST(PatternBackends, DynamicBackendsEstimateInForward) {
  for (const std::string pattern : {"dynamic_topk", "threshold"}) {
    SparseAttnConfig c = config_for(pattern);
    c.options["similarity_threshold"] = "-2";
    const PatternSpec spec = spec_of(c);
    auto backend = builtins().get(pattern);
    Inputs t = inputs(256);
    auto metadata = backend->make_metadata_builder()->plan(ExecContext{}, spec, ModuleType::kDitSelf, AttentionShape::of(t.q.view(), t.k.view(), t.v.view()));
    const ForwardStats stats = backend->make_impl()->forward(ExecContext{}, t.q.view(), t.k.view(), t.v.view(), *metadata, StepInfo{}, t.out.view(), TensorView{});
    const BlockMask mask = pattern == "dynamic_topk" ? estimate_topk_mask(ExecContext{}, t.q.view(), t.k.view(), topk_options_from_spec(spec)).mask
                                                     : estimate_xattention_mask(ExecContext{}, t.q.view(), t.k.view(), xattention_options_from_spec(spec)).mask;
    EXPECT_NEAR(stats.density, mask.density(), 1e-12) << pattern;
    EXPECT_LT(stats.density, 1.0) << pattern;
    EXPECT_GE(stats.estimate_ms, 0.0);
    block_sparse_attention_forward(ExecContext{}, t.q.view(), t.k.view(), t.v.view(), mask.view(), t.expected.view(), TensorView{});
    EXPECT_LT(testing::relative_l2(t.out.view(), t.expected.view()), 1e-6) << pattern;
  }
}

TEST(PatternBackends, BadSpecsAreErrors) {
  Inputs t = inputs(200);
  const AttentionShape shape = AttentionShape::of(t.q.view(), t.k.view(), t.v.view());
  auto radial = builtins().get("radial");
  testing::expect_error([&] { radial->make_metadata_builder()->plan(ExecContext{}, spec_of(config_for("radial")), ModuleType::kDitSelf, shape); },
                        "seq_q = seq_kv = 256");
  SparseAttnConfig c = config_for("dynamic_topk");
  c.options["cdf"] = "abc";
  testing::expect_error([&] { topk_options_from_spec(spec_of(c)); }, "pattern.options.cdf");
  c.options.erase("cdf");
  c.options["per_head"] = "0.1,0.2";
  EXPECT_EQ(topk_options_from_spec(spec_of(c)).per_head, (std::vector<double>{0.1, 0.2}));
  c.options["per_head"] = "0.1,x";
  testing::expect_error([&] { topk_options_from_spec(spec_of(c)); }, "pattern.options.per_head");
  SparseAttnConfig x = config_for("threshold");
  x.options["vote"] = "all";
  testing::expect_error([&] { xattention_options_from_spec(spec_of(x)); }, "vote");
}

}  // namespace
}  // namespace tessel
