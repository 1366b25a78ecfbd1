// The head_classify backend: its forward equals the fp64 reference under the per-head class mask
// its probe chose (in its token order), the probe runs on a layer's first forward and then every
// probe_interval steps (the classes are reused in between, per layer), and bad options are errors.
#include <gtest/gtest.h>

#include "sparse/pattern_test_util.h"
#include "sparse/sparse_test_util.h"
#include "tessel/core/error.h"
#include "tessel/sparse/pattern_backends.h"

namespace tessel {
namespace {

using namespace tessel::testing;

PatternSpec head_classify_spec() {
  PatternSpec spec;
  spec.type = PatternType::kHeadClassify;
  spec.block_q = 32;
  spec.block_kv = 32;
  spec.spatial_layout = SpatialLayout{4, 16, 16, 2};  // 4 frames of 8 x 8 patches
  spec.spatial_radius = 2;
  spec.options["probe_rows"] = "16";
  spec.options["probe_interval"] = "3";
  return spec;
}

TEST(HeadClassifyBackend, ForwardEqualsTheReferenceUnderItsClassMask) {
  const PatternSpec spec = head_classify_spec();
  const auto backend = make_head_classify_backend();
  const Qkv t = random_qkv(1, 256, 256, 4, 2, 32, DType::kF32, 8);
  const auto metadata =
      backend->make_metadata_builder()->plan(ExecContext{}, spec, ModuleType::kDitSelf, AttentionShape::of(t.q, t.k, t.v));
  Tensor out = poisoned(t.q.shape(), DType::kF32), lse = poisoned({1, 4, 256}, DType::kF32);
  const ForwardStats stats = backend->make_impl()->forward(ExecContext{}, t.q, t.k, t.v, *metadata, StepInfo{}, out, lse);

  const HeadClassifierOptions o = head_classifier_options_from_spec(spec);
  const HeadClassPlans plans = plan_head_classes(token_layout_from_spec(spec), o);
  const BlockMask mask = head_class_mask(plans, probe_head_classes(ExecContext{}, t.q, t.k, plans, o).classes);
  EXPECT_DOUBLE_EQ(stats.density, mask.density());
  ASSERT_FALSE(metadata->permutation.empty());  // Hilbert order by default
  std::vector<int64_t> order = metadata->permutation;
  const Qkv permuted{gather_tokens(t.q, order), gather_tokens(t.k, order), gather_tokens(t.v, order)};
  const auto exact = reference::block_sparse_attention(permuted.q, permuted.k, permuted.v, mask.view());
  const Tensor out_permuted = gather_tokens(out, order);
  const testing::Errors got = compare(out_permuted, Tensor{}, exact);
  EXPECT_TRUE(got.finite);
  EXPECT_LE(got.out, 1e-5);
}

TEST(HeadClassifyBackend, ProbesEveryIntervalStepsPerLayer) {
  const PatternSpec spec = head_classify_spec();
  const auto backend = make_head_classify_backend();
  const Qkv t = random_qkv(1, 256, 256, 2, 2, 32, DType::kF32, 9);
  const auto metadata =
      backend->make_metadata_builder()->plan(ExecContext{}, spec, ModuleType::kDitSelf, AttentionShape::of(t.q, t.k, t.v));
  const auto impl = backend->make_impl();
  Tensor out = Tensor::empty(t.q.shape(), DType::kF32);
  const auto probed = [&](int64_t step, int64_t layer) {
    return impl->forward(ExecContext{}, t.q, t.k, t.v, *metadata, StepInfo::at(step, 10, layer), out, TensorView{})
               .estimate_ms > 0.0;
  };
  EXPECT_TRUE(probed(0, 0));
  EXPECT_TRUE(probed(0, 1));  // another layer has its own classes
  EXPECT_FALSE(probed(1, 0));
  EXPECT_FALSE(probed(2, 0));
  EXPECT_TRUE(probed(3, 0));
  EXPECT_TRUE(probed(0, 0));  // a new denoising run
}

TEST(HeadClassifyBackend, RejectsBadOptions) {
  const auto builder = make_head_classify_backend()->make_metadata_builder();
  PatternSpec spec = head_classify_spec();
  spec.options["min_frame_mass"] = "1.5";
  expect_error_containing([&] { builder->plan(ExecContext{}, spec, ModuleType::kDitSelf, 2, 2, 32, 256, 256); },
                          {"head_classify.min_frame_mass", "(0, 1]"});
  spec = head_classify_spec();
  expect_error_containing([&] { builder->plan(ExecContext{}, spec, ModuleType::kDitSelf, 2, 2, 32, 300, 300); },
                          {"head_classify", "256 queries and keys"});
  spec.spatial_layout.reset();
  expect_error_containing([&] { spec.validate(); }, {"pattern.spatial_layout"});
}

}  // namespace
}  // namespace tessel
