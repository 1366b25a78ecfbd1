// Built-in backends (dense, block_sparse) and the mask-planning extension point against the fp64
// reference: explicit masks, the block-granular window, always-keep options, token permutations,
// data-dependent estimators, and the errors of each.
#include <gtest/gtest.h>

#include "sparse/sparse_test_util.h"
#include "tessel/core/error.h"
#include "tessel/sparse/builtin_backends.h"

namespace tessel {
namespace {

using namespace tessel::testing;

struct BackendRun {
  Tensor out, lse;
  ForwardStats stats;
  std::shared_ptr<Metadata> metadata;
};

BackendRun run_backend(const Backend& backend, const PatternSpec& spec, const Qkv& t, const StepInfo& step = {}) {
  const AttentionShape shape = AttentionShape::of(t.q, t.k, t.v);
  BackendRun run;
  run.metadata = backend.make_metadata_builder()->plan(ExecContext{}, spec, ModuleType::kDitSelf, shape);
  run.out = poisoned(t.q.shape(), t.q.dtype());
  run.lse = poisoned({shape.batch, shape.num_qo_heads, shape.seq_q}, DType::kF32);
  run.stats = backend.make_impl()->forward(ExecContext{}, t.q, t.k, t.v, *run.metadata, step, run.out, run.lse);
  return run;
}

BlockMaskShape mask_shape(int64_t seq_q, int64_t seq_kv, int64_t block_q, int64_t block_kv, int64_t heads = 1) {
  BlockMaskShape s;
  s.mask_heads = heads;
  s.seq_q = seq_q;
  s.seq_kv = seq_kv;
  s.block_q = block_q;
  s.block_kv = block_kv;
  return s;
}

std::vector<std::vector<int32_t>> rows_of(const BlockMask& mask) {
  std::vector<std::vector<int32_t>> rows;
  const BlockMaskShape& s = mask.shape();
  for (int64_t b = 0; b < s.mask_batch; ++b)
    for (int64_t h = 0; h < s.mask_heads; ++h)
      for (int64_t q = 0; q < s.q_blocks(); ++q) rows.push_back(mask.row(b, h, q));
  return rows;
}

TEST(DenseBackend, EqualsTheReferenceForEveryPattern) {
  const auto dense = make_dense_backend();
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const Qkv t = random_qkv(2, 70, 133, 8, 2, 64, dtype, 5);
    PatternSpec spec;
    spec.type = PatternType::kDynamicTopk;  // dense ignores the pattern
    spec.topk_ratio = 0.1;
    const BackendRun run = run_backend(*dense, spec, t);
    EXPECT_DOUBLE_EQ(run.stats.density, 1.0);
    const auto exact = reference::attention(t.q, t.k, t.v);
    expect_close_to_reference(t, {}, [](int64_t, int64_t, int64_t, int64_t) { return true; }, run.out, run.lse, exact);
  }
}

TEST(BlockSparseBackend, ExplicitPerHeadMaskEqualsTheReference) {
  const auto backend = make_block_sparse_backend();
  const Qkv t = random_qkv(1, 200, 200, 4, 2, 32, DType::kF32, 9);
  PatternSpec spec;
  spec.type = PatternType::kBlockSparse;
  spec.block_q = 32;
  spec.block_kv = 16;
  const BlockMask mask = BlockMask::random(mask_shape(200, 200, 32, 16, 2), 0.3, 11);
  spec.block_mask = std::make_shared<const BlockMask>(mask);
  const BackendRun run = run_backend(*backend, spec, t);
  EXPECT_DOUBLE_EQ(run.stats.density, mask.density());
  EXPECT_DOUBLE_EQ(run.metadata->planned_density(), mask.density());
  expect_matches_masked_reference(t, mask, run.out, run.lse);
}

TEST(BlockSparseBackend, SlidingWindowMaskIsBlockGranular) {
  PatternSpec spec;
  spec.type = PatternType::kSlidingWindow;
  spec.block_q = 64;
  spec.block_kv = 64;
  AttentionShape shape;
  shape.seq_q = shape.seq_kv = 256;
  spec.window_size = 10;  // reaches the neighbouring blocks only
  EXPECT_EQ(rows_of(plan_sliding_window_blocks(spec, ModuleType::kDitSelf, shape).mask),
            (std::vector<std::vector<int32_t>>{{0, 1}, {0, 1, 2}, {1, 2, 3}, {2, 3}}));
  spec.window_size = 0;  // the diagonal blocks
  EXPECT_EQ(rows_of(plan_sliding_window_blocks(spec, ModuleType::kDitSelf, shape).mask),
            (std::vector<std::vector<int32_t>>{{0}, {1}, {2}, {3}}));
  // seq_q < seq_kv: queries sit at the end of the keys (bottom-right alignment).
  shape.seq_q = 64;
  spec.window_size = 0;
  EXPECT_EQ(rows_of(plan_sliding_window_blocks(spec, ModuleType::kDitSelf, shape).mask),
            (std::vector<std::vector<int32_t>>{{3}}));
}

TEST(BlockSparseBackend, SlidingWindowEqualsTheReferenceWithItsMask) {
  const auto backend = make_block_sparse_backend();
  const Qkv t = random_qkv(2, 150, 230, 4, 4, 32, DType::kF32, 21);
  PatternSpec spec;
  spec.type = PatternType::kSlidingWindow;
  spec.block_q = 32;
  spec.block_kv = 32;
  spec.window_size = 24;
  const BackendRun run = run_backend(*backend, spec, t);
  const BlockMask mask = sink_window_mask(150, 230, 32, 32, 24, 0);
  EXPECT_EQ(rows_of(*run.metadata->mask), rows_of(mask));
  expect_matches_masked_reference(t, mask, run.out, run.lse);
}

TEST(BlockSparseBackend, RejectsWhatItCannotRun) {
  const auto backend = make_block_sparse_backend();
  const auto builder = backend->make_metadata_builder();
  PatternSpec spec;
  spec.type = PatternType::kBlockSparse;
  spec.block_mask = std::make_shared<const BlockMask>(BlockMask::full(mask_shape(128, 128, 128, 64)));
  // The explicit mask must match the attention shape.
  try {
    builder->plan(ExecContext{}, spec, ModuleType::kDitSelf, 1, 1, 16, 256, 128);
    ADD_FAILURE() << "expected a geometry error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backend 'block_sparse' mask sequence lengths"), std::string::npos) << e.what();
  }
  PatternSpec topk;
  topk.type = PatternType::kDynamicTopk;
  topk.topk_ratio = 0.5;
  EXPECT_THROW(builder->plan(ExecContext{}, topk, ModuleType::kDitSelf, 1, 1, 16, 128, 128), Error);
  PatternSpec spatial_window;  // the 3-D window needs a pattern backend
  spatial_window.type = PatternType::kSlidingWindow;
  spatial_window.spatial_layout = SpatialLayout{1, 16, 16, 2};
  EXPECT_THROW(builder->plan(ExecContext{}, spatial_window, ModuleType::kDitSelf, 1, 1, 16, 64, 64), Error);

  // forward with other shapes than planned
  spec.block_mask = std::make_shared<const BlockMask>(BlockMask::full(mask_shape(128, 128, 128, 64)));
  const auto metadata = builder->plan(ExecContext{}, spec, ModuleType::kDitSelf, 2, 2, 16, 128, 128, 1, DType::kF32);
  const Qkv t = random_qkv(1, 128, 128, 2, 2, 32, DType::kF32, 1);
  Tensor out = poisoned(t.q.shape(), DType::kF32);
  try {
    backend->make_impl()->forward(ExecContext{}, t.q, t.k, t.v, *metadata, StepInfo{}, out, {});
    ADD_FAILURE() << "expected a shape error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the planned shape B=1 Sq=128 Skv=128 Hq=2 Hkv=2 D=16"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(std::isnan(element_as_double(out, 0)));  // nothing written
}

TEST(AlwaysKeep, DiagonalSinksAndTextAreUnionedIn) {
  const BlockMask empty = BlockMask::from_rows(mask_shape(256, 256, 64, 64), {{}, {}, {}, {}});
  PatternSpec spec;
  spec.block_q = spec.block_kv = 64;
  EXPECT_EQ(rows_of(apply_always_keep(spec, empty)), rows_of(empty));  // nothing asked: unchanged
  spec.keep_diagonal = true;
  EXPECT_EQ(rows_of(apply_always_keep(spec, empty)), (std::vector<std::vector<int32_t>>{{0}, {1}, {2}, {3}}));
  spec.sink_blocks = 2;
  EXPECT_EQ(rows_of(apply_always_keep(spec, empty)),
            (std::vector<std::vector<int32_t>>{{0, 1}, {0, 1}, {0, 1, 2}, {0, 1, 3}}));
  spec.keep_diagonal = false;
  spec.sink_blocks = 0;
  spec.keep_text = true;
  spec.num_text_tokens = 70;  // blocks 0 and 1 hold text: rows 0-1 full, columns 0-1 everywhere
  EXPECT_EQ(rows_of(apply_always_keep(spec, empty)),
            (std::vector<std::vector<int32_t>>{{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1}, {0, 1}}));
  spec.text_first = false;  // text at the end: block 2 (tokens 186..) and 3
  EXPECT_EQ(rows_of(apply_always_keep(spec, empty)),
            (std::vector<std::vector<int32_t>>{{2, 3}, {2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}}));
}

TEST(AlwaysKeep, DiagonalRangeFollowsBottomRightAlignment) {
  const BlockMaskShape s = mask_shape(100, 300, 50, 64);
  // shift 200: q block 0 = tokens 200..249 -> kv blocks 3; q block 1 = 250..299 -> kv blocks 3..4
  EXPECT_EQ(diagonal_kv_blocks(s, 0).first, 3);
  EXPECT_EQ(diagonal_kv_blocks(s, 0).last, 3);
  EXPECT_EQ(diagonal_kv_blocks(s, 1).first, 3);
  EXPECT_EQ(diagonal_kv_blocks(s, 1).last, 4);
  const BlockMaskShape longer_q = mask_shape(300, 100, 64, 64);  // shift -200: first q blocks see nothing
  EXPECT_GT(diagonal_kv_blocks(longer_q, 0).first, diagonal_kv_blocks(longer_q, 0).last);
}

TEST(MaskPlanningBackend, PermutedTokensAttendAsTheMaskMappedBack) {
  // Reverse the order of 32-token blocks (tokens inside a block keep their order), plan a random
  // mask in the permuted order; the user-order result must equal the mask mapped back.
  const int64_t seq = 256, block = 32, nb = seq / block;
  std::vector<int64_t> permutation(static_cast<size_t>(seq));
  for (int64_t t = 0; t < seq; ++t) permutation[static_cast<size_t>(t)] = (nb - 1 - t / block) * block + t % block;
  const BlockMask permuted_mask = BlockMask::random(mask_shape(seq, seq, block, block, 2), 0.4, 3);
  PatternBackendInfo info;
  info.name = "reversed";
  info.patterns = {PatternType::kSpatialAware};
  const auto backend = make_mask_planning_backend(info, [&](const PatternSpec&, ModuleType, const AttentionShape&) {
    return PlannedMask{permuted_mask, permutation, {}};
  });
  PatternSpec spec;
  spec.type = PatternType::kSpatialAware;
  spec.block_q = spec.block_kv = block;
  spec.spatial_layout = SpatialLayout{1, 32, 16, 2};
  spec.spatial_radius = 1;
  const Qkv t = random_qkv(2, seq, seq, 4, 2, 16, DType::kF32, 8);
  const BackendRun run = run_backend(*backend, spec, t);
  EXPECT_EQ(run.metadata->permutation, permutation);

  std::vector<uint8_t> dense = permuted_mask.to_dense(), user(dense.size());
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t a = 0; a < nb; ++a)
      for (int64_t b = 0; b < nb; ++b)
        user[static_cast<size_t>((h * nb + a) * nb + b)] = dense[static_cast<size_t>((h * nb + (nb - 1 - a)) * nb + (nb - 1 - b))];
  expect_matches_masked_reference(t, BlockMask::from_dense(mask_shape(seq, seq, block, block, 2), user), run.out, run.lse);
}

TEST(MaskPlanningBackend, BadPlannerOutputIsNamed) {
  PatternBackendInfo info;
  info.name = "sloppy";
  info.patterns = {PatternType::kRadial};
  PatternSpec spec;
  spec.type = PatternType::kRadial;
  spec.spatial_layout = SpatialLayout{2, 8, 8, 2};
  const auto wrong_blocks = make_mask_planning_backend(info, [](const PatternSpec&, ModuleType, const AttentionShape& s) {
    return PlannedMask{BlockMask::full(mask_shape(s.seq_q, s.seq_kv, 16, 16)), {}, {}};
  });
  try {
    wrong_blocks->make_metadata_builder()->plan(ExecContext{}, spec, ModuleType::kDitSelf, 2, 2, 16, 32, 32);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backend 'sloppy' mask block sizes: expected 128x64, got 16x16"), std::string::npos)
        << e.what();
  }
  const auto bad_permutation = make_mask_planning_backend(info, [](const PatternSpec& p, ModuleType, const AttentionShape& s) {
    return PlannedMask{BlockMask::full(mask_shape(s.seq_q, s.seq_kv, p.block_q, p.block_kv)), std::vector<int64_t>(32, 0), {}};
  });
  try {
    bad_permutation->make_metadata_builder()->plan(ExecContext{}, spec, ModuleType::kDitSelf, 2, 2, 16, 32, 32);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("permutation[1]"), std::string::npos) << e.what();
  }
}

TEST(MaskEstimatingBackend, EstimatesInsideForwardWithTheStepsTopk) {
  int calls = 0;
  double seen_topk = 0.0;
  PatternBackendInfo info;
  info.name = "diagonal_estimator";
  info.patterns = {PatternType::kDynamicTopk};
  const auto backend = make_mask_estimating_backend(
      info, [&](const ExecContext&, const TensorView& q, const TensorView&, const PatternSpec& spec,
                const StepInfo& step, const AttentionShape& shape) {
        ++calls;
        seen_topk = step.density.value_or(*spec.topk_ratio);
        EXPECT_EQ(q.size(1), shape.seq_q);
        std::vector<std::vector<int32_t>> rows(static_cast<size_t>((shape.seq_q + spec.block_q - 1) / spec.block_q));
        return BlockMask::from_rows(mask_shape(shape.seq_q, shape.seq_kv, spec.block_q, spec.block_kv), rows);
      });
  PatternSpec spec;
  spec.type = PatternType::kDynamicTopk;
  spec.topk_ratio = 0.3;
  spec.block_q = spec.block_kv = 32;
  spec.keep_diagonal = true;  // the estimator keeps nothing; always-keep adds the diagonal
  const Qkv t = random_qkv(1, 128, 128, 2, 2, 16, DType::kF32, 4);
  const BackendRun run = run_backend(*backend, spec, t);
  EXPECT_EQ(calls, 1);
  EXPECT_DOUBLE_EQ(seen_topk, 0.3);
  EXPECT_DOUBLE_EQ(run.stats.density, 0.25);
  EXPECT_GE(run.stats.estimate_ms, 0.0);
  EXPECT_EQ(run.metadata->mask, nullptr);  // nothing static
  EXPECT_DOUBLE_EQ(run.metadata->planned_density(), 0.3);
  expect_matches_masked_reference(t, sink_window_mask(128, 128, 32, 32, 0, 0), run.out, run.lse);

  // The schedule's density for a step arrives in the StepInfo; the plan's spec is not touched.
  StepInfo step = StepInfo::at(4, 10);
  step.density = 0.6;
  run_backend(*backend, spec, t, step);
  EXPECT_EQ(calls, 2);
  EXPECT_DOUBLE_EQ(seen_topk, 0.6);
}

}  // namespace
}  // namespace tessel
