// DiTSparseAttentionAdapter across steps and layers (the step passed to every forward), the plan
// cache shared by layers,
// the SparseAttention module (resolution, dense bypass with an explicit mask, one warning), and
// the masked dense fallback against the reference.
#include <gtest/gtest.h>

#include <cstring>

#include "sparse/sparse_test_util.h"
#include "tessel/core/error.h"
#include "tessel/sparse/builtin_backends.h"
#include "tessel/sparse/schedule.h"
#include "tessel/sparse/sparse_attention.h"

namespace tessel {
namespace {

using namespace tessel::testing;

// Delegates to block_sparse and counts what the adapter calls.
struct Counts {
  int plans = 0, forwards = 0;
  std::vector<StepInfo> steps;  // the StepInfo each forward received
};

class CountingBackend : public Backend {
 public:
  explicit CountingBackend(std::shared_ptr<Counts> counts) : inner_(make_block_sparse_backend()), counts_(std::move(counts)) {}
  std::string name() const override { return "counting"; }
  std::vector<PatternType> supported_patterns() const override { return inner_->supported_patterns(); }
  std::vector<ModuleType> supported_module_types() const override { return inner_->supported_module_types(); }
  std::vector<DeviceType> supported_devices() const override { return inner_->supported_devices(); }

  std::unique_ptr<MetadataBuilder> make_metadata_builder() const override {
    struct Builder : MetadataBuilder {
      std::unique_ptr<MetadataBuilder> inner;
      std::shared_ptr<Counts> counts;
      std::shared_ptr<Metadata> plan(const ExecContext& ctx, const PatternSpec& s, ModuleType m,
                                     const AttentionShape& a) override {
        ++counts->plans;
        return inner->plan(ctx, s, m, a);
      }
    };
    auto builder = std::make_unique<Builder>();
    builder->inner = inner_->make_metadata_builder();
    builder->counts = counts_;
    return builder;
  }
  std::unique_ptr<Impl> make_impl() const override {
    struct CountingImpl : Impl {
      std::unique_ptr<Impl> inner;
      std::shared_ptr<Counts> counts;
      ForwardStats forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                           const Metadata& m, const StepInfo& step, const TensorView& out,
                           const TensorView& lse) override {
        ++counts->forwards;
        counts->steps.push_back(step);
        return inner->forward(ctx, q, k, v, m, step, out, lse);
      }
    };
    auto impl = std::make_unique<CountingImpl>();
    impl->inner = inner_->make_impl();
    impl->counts = counts_;
    return impl;
  }

 private:
  std::shared_ptr<Backend> inner_;
  std::shared_ptr<Counts> counts_;
};

SparseAttnConfig window_config() {
  SparseAttnConfig c;
  c.pattern.type = PatternType::kSlidingWindow;
  c.pattern.window_size = 16;
  c.geometry.block_q = 32;
  c.geometry.block_kv = 32;
  return c;
}

ResolvedSparseAttnConfig resolved_window_config() { return ResolvedSparseAttnConfig(window_config()); }

void expect_dense(const Qkv& t, const TensorView& out, const TensorView& lse) {
  const auto exact = reference::attention(t.q, t.k, t.v);
  expect_close_to_reference(t, {}, [](int64_t, int64_t, int64_t, int64_t) { return true; }, out, lse, exact);
}

TEST(DiTSparseAttentionAdapter, StepsAndLayersReachTheBackend) {
  auto counts = std::make_shared<Counts>();
  const auto backend = std::make_shared<CountingBackend>(counts);
  SparseAttnConfig config = window_config();
  config.schedule = "conservative";
  config.warmup.dense_steps = 2;
  config.warmup.dense_layers = 1;
  const ResolvedSparseAttnConfig resolved(config);
  const auto cache = std::make_shared<PlanCache>();
  std::vector<DiTSparseAttentionAdapter> layers;
  for (int64_t layer = 0; layer < 3; ++layer)
    layers.emplace_back(backend, ModuleType::kDitSelf, 4, 2, 16, resolved, layer, cache);
  EXPECT_EQ(layers[2].layer_index(), 2);
  const ExecContext ctx;

  const Qkv t = random_qkv(1, 128, 128, 4, 2, 16, DType::kF32, 31);
  const BlockMask window_mask = sink_window_mask(128, 128, 32, 32, 16, 0);
  const int64_t total = 10;
  int sparse_forwards = 0;
  for (int64_t step = 0; step < total; ++step) {
    for (const auto& layer : layers) {
      const StepInfo info = StepInfo::at(step, total, /*layer=*/99, /*cfg_branch=*/1);
      Tensor out = poisoned(t.q.shape(), DType::kF32);
      Tensor lse = poisoned({1, 4, 128}, DType::kF32);
      const AttentionStepReport report = layer.forward(ctx, info, t.q, t.k, t.v, out, lse);
      const double density = step_density(config, step, total, layer.layer_index());
      const bool expect_dense_run = step < 2 || layer.layer_index() < 1 || density >= 1.0;
      SCOPED_TRACE("step " + std::to_string(step) + " layer " + std::to_string(layer.layer_index()));
      EXPECT_EQ(report.dense, expect_dense_run);
      EXPECT_EQ(report.backend, expect_dense_run ? "dense" : "counting");
      EXPECT_DOUBLE_EQ(layer.density_at(info), density);
      if (expect_dense_run) {
        EXPECT_DOUBLE_EQ(report.density, 1.0);
        if (step == 0) expect_dense(t, out, lse);
      } else {
        ++sparse_forwards;
        EXPECT_DOUBLE_EQ(report.density, window_mask.density());
        if (step == total - 1) expect_matches_masked_reference(t, window_mask, out, lse);
        // The backend sees the step, the adapter's layer, the caller's branch and the density.
        const StepInfo& seen = counts->steps.back();
        EXPECT_EQ(seen.step, step);
        EXPECT_EQ(seen.total_steps, total);
        EXPECT_EQ(seen.layer, layer.layer_index());
        EXPECT_EQ(seen.cfg_branch, 1);
        ASSERT_TRUE(seen.density.has_value());
        EXPECT_DOUBLE_EQ(*seen.density, density);
      }
    }
  }
  EXPECT_GT(sparse_forwards, 0);
  EXPECT_EQ(counts->forwards, sparse_forwards);
  EXPECT_EQ(counts->plans, 1);             // one plan for every layer and step
  EXPECT_EQ(cache->misses(), 1);
  EXPECT_EQ(cache->hits(), sparse_forwards - 1);

  // Without a step: no step warm-up, the config's ratio; plans kept.
  EXPECT_DOUBLE_EQ(layers[1].density_at(StepInfo{}), config.selection.topk_ratio);
  Tensor out = poisoned(t.q.shape(), DType::kF32);
  const AttentionStepReport after = layers[1].forward(ctx, StepInfo{}, t.q, t.k, t.v, out, {});
  EXPECT_FALSE(after.dense);  // layer 1 is past dense_layers
  EXPECT_FALSE(counts->steps.back().step.has_value());
  EXPECT_EQ(cache->misses(), 1);
  EXPECT_EQ(counts->plans, 1);
  EXPECT_TRUE(layers[0].forward(ctx, StepInfo{}, t.q, t.k, t.v, out, {}).dense);  // dense layer stays dense
}

TEST(DiTSparseAttentionAdapter, RejectsBadStepsAndShapes) {
  DiTSparseAttentionAdapter adapter(make_block_sparse_backend(), ModuleType::kDitSelf, 4, 2, 16, resolved_window_config());
  const ExecContext ctx;
  const Qkv ok = random_qkv(1, 64, 64, 4, 2, 16, DType::kF32, 3);
  Tensor ok_out = poisoned(ok.q.shape(), DType::kF32);
  EXPECT_THROW(adapter.forward(ctx, StepInfo::at(5, 5), ok.q, ok.k, ok.v, ok_out, {}), Error);
  EXPECT_THROW(adapter.forward(ctx, StepInfo::at(-1, 5), ok.q, ok.k, ok.v, ok_out, {}), Error);
  EXPECT_THROW(adapter.forward(ctx, StepInfo::at(0, 0), ok.q, ok.k, ok.v, ok_out, {}), Error);
  const Qkv wrong_heads = random_qkv(1, 64, 64, 8, 2, 16, DType::kF32, 1);
  Tensor out = poisoned(wrong_heads.q.shape(), DType::kF32);
  EXPECT_THROW(adapter.forward(ctx, StepInfo{}, wrong_heads.q, wrong_heads.k, wrong_heads.v, out, {}), Error);
  EXPECT_THROW(DiTSparseAttentionAdapter(nullptr, ModuleType::kDitSelf, 4, 3, 16, resolved_window_config()), Error);
  // block_sparse cannot run dynamic_topk (the default pattern): refused at the first plan
  DiTSparseAttentionAdapter cannot(make_block_sparse_backend(), ModuleType::kDitSelf, 4, 2, 16, ResolvedSparseAttnConfig());
  const Qkv t = random_qkv(1, 64, 64, 4, 2, 16, DType::kF32, 2);
  Tensor out2 = poisoned(t.q.shape(), DType::kF32);
  EXPECT_THROW(cannot.forward(ctx, StepInfo{}, t.q, t.k, t.v, out2, {}), Error);
}

// A caller whose workspace cannot grow (a suffix of its own, as the Wan CUDA forward hands its
// attention) reserves workspace_bytes() first: forward then fits in exactly that room, dense
// (warm-up step) and sparse, and in less it throws before writing anything.
TEST(DiTSparseAttentionAdapter, WorkspaceBytesIsWhatForwardReserves) {
  SparseAttnConfig config = window_config();
  config.warmup.dense_steps = 1;
  DiTSparseAttentionAdapter adapter(make_block_sparse_backend(), ModuleType::kDitSelf, 4, 2, 16,
                                    ResolvedSparseAttnConfig(config), /*layer_index=*/0);
  const Qkv t = random_qkv(1, 96, 96, 4, 2, 16, DType::kF32, 44);
  const AttentionShape shape = AttentionShape::of(t.q, t.k, t.v);
  const ExecContext base;
  for (const int64_t step : {0, 1}) {  // step 0 is the dense warm-up, step 1 sparse
    SCOPED_TRACE("step " + std::to_string(step));
    const StepInfo info = StepInfo::at(step, 4);
    const size_t need = adapter.workspace_bytes(base, info, shape);
    EXPECT_GT(need, 0u);  // the CPU kernels take per-thread tiles from the workspace

    Workspace growable(Device::cpu());
    Tensor out = poisoned(t.q.shape(), DType::kF32);
    adapter.forward(base.with_workspace(&growable), info, t.q, t.k, t.v, out, {});
    EXPECT_EQ(growable.capacity(), workspace_slice_bytes(need));

    Workspace owner(Device::cpu());
    owner.reserve(workspace_slice_bytes(64) + need);
    Workspace exact = owner.suffix(64);
    EXPECT_NO_THROW(adapter.forward(base.with_workspace(&exact), info, t.q, t.k, t.v, out, {}));
    if (step == 0) expect_dense(t, out, {});
    else expect_matches_masked_reference(t, sink_window_mask(96, 96, 32, 32, 16, 0), out, {});

    Workspace small_owner(Device::cpu());
    small_owner.reserve(workspace_slice_bytes(64) + need / 2);
    Workspace small = small_owner.suffix(64);
    Tensor untouched = poisoned(t.q.shape(), DType::kF32);
    const Tensor before = untouched.clone();
    EXPECT_THROW(adapter.forward(base.with_workspace(&small), info, t.q, t.k, t.v, untouched, {}), Error);
    EXPECT_EQ(std::memcmp(before.data(), untouched.data(), before.nbytes()), 0);
  }
  const Qkv wrong = random_qkv(1, 96, 96, 8, 2, 16, DType::kF32, 45);
  EXPECT_THROW(adapter.workspace_bytes(base, StepInfo::at(1, 4), AttentionShape::of(wrong.q, wrong.k, wrong.v)), Error);
}

TEST(DiTSparseAttentionAdapter, NoBackendMeansDense) {
  DiTSparseAttentionAdapter adapter(nullptr, ModuleType::kDitSelf, 2, 2, 32, resolved_window_config());
  const Qkv t = random_qkv(2, 50, 90, 2, 2, 32, DType::kF32, 12);
  Tensor out = poisoned(t.q.shape(), DType::kF32), lse = poisoned({2, 2, 50}, DType::kF32);
  const AttentionStepReport report = adapter.forward(ExecContext{}, StepInfo::at(3, 4), t.q, t.k, t.v, out, lse);
  EXPECT_TRUE(report.dense);
  expect_dense(t, out, lse);
  EXPECT_EQ(adapter.plan_cache()->size(), 0u);
}

TEST(PlanCache, OnePlanPerShapeSharedByLayers) {
  auto counts = std::make_shared<Counts>();
  const auto backend = std::make_shared<CountingBackend>(counts);
  const auto cache = std::make_shared<PlanCache>();
  std::vector<DiTSparseAttentionAdapter> layers;
  for (int64_t layer = 0; layer < 6; ++layer)
    layers.emplace_back(backend, ModuleType::kDitSelf, 2, 2, 16, resolved_window_config(), layer, cache);
  const Qkv a = random_qkv(1, 96, 96, 2, 2, 16, DType::kF32, 1);
  const Qkv b = random_qkv(1, 160, 160, 2, 2, 16, DType::kF32, 2);
  const Qkv a_bf16 = random_qkv(1, 96, 96, 2, 2, 16, DType::kBF16, 3);
  for (auto& layer : layers) {
    for (const Qkv* t : {&a, &b, &a_bf16}) {
      Tensor out = Tensor::empty(t->q.shape(), t->q.dtype());
      EXPECT_FALSE(layer.forward(ExecContext{}, StepInfo{}, t->q, t->k, t->v, out, {}).dense);
    }
  }
  EXPECT_EQ(counts->plans, 3);  // (96, fp32), (160, fp32), (96, bf16)
  EXPECT_EQ(cache->size(), 3u);
  EXPECT_EQ(cache->misses(), 3);
  EXPECT_EQ(cache->hits(), 6 * 3 - 3);
  cache->clear();
  EXPECT_EQ(cache->size(), 0u);
  EXPECT_EQ(cache->hits(), 0);

  // Keys differ in every field.
  AttentionShape s;
  s.seq_q = s.seq_kv = 64;
  const auto k0 = PlanCache::make_key(s, "x", ModuleType::kDitSelf, "p");
  EXPECT_FALSE(k0 < k0);
  AttentionShape kv = s;
  kv.num_kv_heads = 2;
  kv.num_qo_heads = 2;
  EXPECT_TRUE(k0 < PlanCache::make_key(kv, "x", ModuleType::kDitSelf, "p") ||
              PlanCache::make_key(kv, "x", ModuleType::kDitSelf, "p") < k0);
  EXPECT_TRUE(k0 < PlanCache::make_key(s, "x", ModuleType::kDitCross, "p"));
  EXPECT_TRUE(k0 < PlanCache::make_key(s, "y", ModuleType::kDitSelf, "p"));
}

SparseAttentionOptions module_options(BackendRegistry& registry, const SparseAttnConfig& config,
                                      std::shared_ptr<PlanCache> cache) {
  SparseAttentionOptions o;
  o.num_heads = 4;
  o.num_kv_heads = 2;
  o.head_dim = 16;
  o.config = config;
  o.dtype = DType::kF32;
  o.registry = &registry;
  o.plan_cache = std::move(cache);
  return o;
}

TEST(SparseAttention, ExplicitMaskBypassesSparseWithOneWarning) {
  const auto owned = builtin_registry();
  BackendRegistry& registry = *owned;
  SparseAttnConfig config = window_config();
  config.backend = "block_sparse";
  const auto cache = std::make_shared<PlanCache>();
  SparseAttention attention(module_options(registry, config, cache));
  EXPECT_EQ(attention.resolution().source, ResolutionSource::kConfig);
  ASSERT_TRUE(attention.resolution().backend);
  EXPECT_EQ(attention.resolution().backend->name(), "block_sparse");

  const Qkv t = random_qkv(2, 128, 128, 4, 2, 16, DType::kF32, 77);
  // Key padding: the last 28 keys of batch 1 are padding.
  Tensor mask = Tensor::empty({2, 128}, DType::kU8);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < 128; ++j) mask.data_as<uint8_t>()[b * 128 + j] = (b == 1 && j >= 100) ? 0 : 1;
  // The reference: batch 0 attends every key; batch 1 attends its first 100 keys only.
  reference::AttentionResult expected = reference::attention(t.q, t.k, t.v);
  {
    Tensor q1 = Tensor::empty({1, 128, 4, 16}, DType::kF32), k1 = Tensor::empty({1, 100, 2, 16}, DType::kF32),
           v1 = Tensor::empty({1, 100, 2, 16}, DType::kF32);
    std::copy_n(t.q.data_as<float>() + 128 * 4 * 16, 128 * 4 * 16, q1.data_as<float>());
    std::copy_n(t.k.data_as<float>() + 128 * 2 * 16, 100 * 2 * 16, k1.data_as<float>());
    std::copy_n(t.v.data_as<float>() + 128 * 2 * 16, 100 * 2 * 16, v1.data_as<float>());
    const reference::AttentionResult r1 = reference::attention(q1, k1, v1);
    std::copy(r1.out.begin(), r1.out.end(), expected.out.begin() + 128 * 4 * 16);
    std::copy(r1.lse.begin(), r1.lse.end(), expected.lse.begin() + 4 * 128);
  }
  const auto keep = [](int64_t b, int64_t, int64_t, int64_t j) { return !(b == 1 && j >= 100); };
  LogCapture log;
  for (int call = 0; call < 3; ++call) {
    Tensor out = poisoned(t.q.shape(), DType::kF32), lse = poisoned({2, 4, 128}, DType::kF32);
    const AttentionStepReport report = attention.forward(ExecContext{}, StepInfo{}, t.q, t.k, t.v, out, lse, mask);
    EXPECT_TRUE(report.dense);
    expect_close_to_reference(t, {}, keep, out, lse, expected);
  }
  EXPECT_EQ(attention.masked_fallbacks(), 3);
  ASSERT_EQ(log.lines.size(), 1u);
  EXPECT_NE(log.lines[0].find("explicit attention mask"), std::string::npos) << log.lines[0];
  EXPECT_NE(log.lines[0].find("block_sparse"), std::string::npos) << log.lines[0];
  EXPECT_EQ(cache->size(), 0u);  // the bypass never planned

  // Without a mask the module runs the backend.
  Tensor out = poisoned(t.q.shape(), DType::kF32);
  const AttentionStepReport sparse = attention.forward(ExecContext{}, StepInfo{}, t.q, t.k, t.v, out, {});
  EXPECT_FALSE(sparse.dense);
  EXPECT_EQ(sparse.backend, "block_sparse");
  expect_matches_masked_reference(t, sink_window_mask(128, 128, 32, 32, 16, 0), out, {});
  // Wrong dtype for this module.
  const Qkv bf = random_qkv(2, 128, 128, 4, 2, 16, DType::kBF16, 1);
  Tensor bf_out = Tensor::empty(bf.q.shape(), DType::kBF16);
  EXPECT_THROW(attention.forward(ExecContext{}, StepInfo{}, bf.q, bf.k, bf.v, bf_out, {}), Error);
}

TEST(SparseAttention, WarningsGoToTheContextsSink) {
  const auto owned = builtin_registry();
  BackendRegistry& registry = *owned;
  SparseAttnConfig config = window_config();
  config.backend = "block_sparse";
  SparseAttention attention(module_options(registry, config, nullptr));
  const Qkv t = random_qkv(1, 64, 64, 4, 2, 16, DType::kF32, 8);
  Tensor mask = Tensor::empty({1, 64}, DType::kU8);
  std::fill_n(mask.data_as<uint8_t>(), 64, uint8_t{1});
  std::vector<std::string> lines;
  ExecContext ctx;
  ctx.log_sink = [&](LogLevel, std::string_view message) { lines.emplace_back(message); };
  LogCapture process_wide;
  Tensor out = poisoned(t.q.shape(), DType::kF32);
  attention.forward(ctx, StepInfo{}, t.q, t.k, t.v, out, {}, mask);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("explicit attention mask"), std::string::npos) << lines[0];
  EXPECT_TRUE(process_wide.lines.empty());
}

TEST(SparseAttention, ResolvesThroughTheOverrideAndNone) {
  // Only block_sparse, so that "auto" has a known answer whatever other built-ins exist.
  BackendRegistry registry(/*discover_plugins=*/false);
  registry.register_backend(make_block_sparse_backend());
  SparseAttnConfig config = window_config();
  {
    SparseAttentionOptions options = module_options(registry, config, nullptr);
    options.backend_override = "none";
    SparseAttention attention(options);
    EXPECT_EQ(attention.resolution().source, ResolutionSource::kEnv);
    EXPECT_EQ(attention.resolution().backend, nullptr);
    // Default: a cache of the module's own, not shared with other modules.
    ASSERT_NE(attention.adapter().plan_cache(), nullptr);
    SparseAttention other(module_options(registry, config, nullptr));
    EXPECT_NE(attention.adapter().plan_cache(), other.adapter().plan_cache());
    const Qkv t = random_qkv(1, 64, 64, 4, 2, 16, DType::kF32, 6);
    Tensor out = poisoned(t.q.shape(), DType::kF32);
    EXPECT_TRUE(attention.forward(ExecContext{}, StepInfo{}, t.q, t.k, t.v, out, {}).dense);
    expect_dense(t, out, {});
  }
  {
    SparseAttention attention(module_options(registry, config, nullptr));
    EXPECT_EQ(attention.resolution().source, ResolutionSource::kAuto);  // block_sparse runs sliding_window
    EXPECT_EQ(attention.resolution().backend->name(), "block_sparse");
  }
}

TEST(MaskedAttention, FourDimensionalMaskEqualsTheBlockReferenceAndEmptyRowsAreZero) {
  const Qkv t = random_qkv(1, 64, 64, 2, 1, 16, DType::kF32, 4);
  BlockMaskShape s;
  s.mask_heads = 2;
  s.seq_q = s.seq_kv = 64;
  s.block_q = s.block_kv = 16;
  // Head 1, q block 0 keeps nothing: those rows get 0 and -inf.
  const BlockMask blocks = BlockMask::from_rows(s, {{0, 2}, {1}, {0, 3}, {2, 3}, {}, {0, 1, 2}, {2}, {3}});
  const std::vector<uint8_t> dense = blocks.to_dense();
  Tensor mask = Tensor::empty({1, 2, 64, 64}, DType::kU8);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 64; ++i)
      for (int64_t j = 0; j < 64; ++j)
        mask.data_as<uint8_t>()[(h * 64 + i) * 64 + j] = dense[static_cast<size_t>((h * 4 + i / 16) * 4 + j / 16)];
  Tensor out = poisoned(t.q.shape(), DType::kF32), lse = poisoned({1, 2, 64}, DType::kF32);
  masked_attention_forward(ExecContext{}, t.q, t.k, t.v, mask, out, lse);
  expect_matches_masked_reference(t, blocks, out, lse);
  EXPECT_EQ(element_as_double(out, (0 * 2 + 1) * 16), 0.0);  // token 0, head 1
  EXPECT_TRUE(std::isinf(element_as_double(lse, 64)));

  Tensor bad = Tensor::empty({1, 3, 64, 64}, DType::kU8);
  EXPECT_THROW(masked_attention_forward(ExecContext{}, t.q, t.k, t.v, bad, out, lse), Error);
  Tensor wrong_dtype = Tensor::empty({1, 64}, DType::kF32);
  EXPECT_THROW(masked_attention_forward(ExecContext{}, t.q, t.k, t.v, wrong_dtype, out, lse), Error);
}

}  // namespace
}  // namespace tessel
