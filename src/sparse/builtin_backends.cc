#include "tessel/sparse/builtin_backends.h"

#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"
#include "tessel/sparse/pattern_backends.h"
#include "tessel/sparse/registry.h"
#include "tessel/sparse/sub_block_mask.h"

namespace tessel {
namespace {

// ---- dense: the DenseFallbackBackend (docs/sparse_attention.md) ------------------------------

class DenseBuilder : public MetadataBuilder {
 public:
  std::shared_ptr<Metadata> plan(const ExecContext&, const PatternSpec& spec, ModuleType module,
                                 const AttentionShape& shape) override {
    shape.validate();
    auto metadata = std::make_shared<Metadata>();
    metadata->set_request("dense", spec, module, shape);
    return metadata;
  }
};

class DenseImpl : public Impl {
 public:
  ForwardStats forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                       const Metadata& metadata, const StepInfo&, const TensorView& out, const TensorView& lse) override {
    check_forward_shape(metadata, q, k, v);
    attention_forward(ctx, q, k, v, out, lse);
    return ForwardStats{1.0, 0.0};
  }
};

class DenseFallbackBackend : public Backend {
 public:
  std::string name() const override { return "dense"; }
  std::vector<PatternType> supported_patterns() const override { return all_pattern_types(); }
  std::vector<ModuleType> supported_module_types() const override { return all_module_types(); }
  std::vector<DeviceType> supported_devices() const override { return PatternBackendInfo::default_devices(); }
  int score() const override { return -1; }
  std::unique_ptr<MetadataBuilder> make_metadata_builder() const override { return std::make_unique<DenseBuilder>(); }
  std::unique_ptr<Impl> make_impl() const override { return std::make_unique<DenseImpl>(); }
};

// ---- block_sparse: explicit masks and the block-granular 1-D window --------------------------

PlannedMask plan_block_sparse(const PatternSpec& spec, ModuleType module, const AttentionShape& shape) {
  return spec.type == PatternType::kBlockSparse ? plan_explicit_block_mask(spec, module, shape)
                                                : plan_sliding_window_blocks(spec, module, shape);
}

}  // namespace

std::shared_ptr<Backend> make_dense_backend() { return std::make_shared<DenseFallbackBackend>(); }

std::shared_ptr<Backend> make_block_sparse_backend() {
  PatternBackendInfo info;
  info.name = "block_sparse";
  info.patterns = {PatternType::kBlockSparse, PatternType::kSlidingWindow};
  info.score = 1;
  info.validate_config = [](const ResolvedSparseAttnConfig& config) {
    const PatternSpec& pattern = config.pattern();
    if (pattern.type == PatternType::kBlockSparse)
      throw Error("sparse_attn.pattern.type: block_sparse needs an explicit BlockMask, which only the C++ API "
                  "(PatternSpec::block_mask) carries; from a config use sliding_window or a pattern backend");
    if (pattern.type == PatternType::kSlidingWindow && !pattern.window_size)
      throw Error("sparse_attn.pattern.window_size: required by the block_sparse backend for pattern sliding_window, "
                  "but not set");
  };
  return make_mask_planning_backend(std::move(info), plan_block_sparse);
}

PlannedMask plan_explicit_block_mask(const PatternSpec& spec, ModuleType, const AttentionShape&) {
  if (!spec.block_mask) throw Error("pattern.block_mask: required by pattern_type block_sparse, but not set");
  PlannedMask planned{*spec.block_mask, {}, {}};
  if (!spec.sub_block_mask.empty()) planned.sub_block_bits = pack_sub_block_mask(planned.mask, spec.sub_block_mask);
  return planned;
}

PlannedMask plan_sliding_window_blocks(const PatternSpec& spec, ModuleType, const AttentionShape& shape) {
  if (!spec.window_size)
    throw Error("pattern.window_size: the block_sparse backend runs the 1-D token window and needs window_size");
  const int64_t window = *spec.window_size;
  BlockMaskShape mask_shape;
  mask_shape.seq_q = shape.seq_q;
  mask_shape.seq_kv = shape.seq_kv;
  mask_shape.block_q = spec.block_q;
  mask_shape.block_kv = spec.block_kv;
  const int64_t shift = shape.seq_kv - shape.seq_q;
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(mask_shape.q_blocks()));
  for (int64_t qb = 0; qb < mask_shape.q_blocks(); ++qb) {
    const int64_t q_lo = qb * spec.block_q;
    const int64_t q_hi = std::min((qb + 1) * spec.block_q, shape.seq_q) - 1;
    const int64_t kv_lo = std::max<int64_t>(q_lo + shift - window, 0);
    const int64_t kv_hi = std::min(q_hi + shift + window, shape.seq_kv - 1);
    for (int64_t kb = kv_lo / spec.block_kv; kv_lo <= kv_hi && kb <= kv_hi / spec.block_kv; ++kb)
      rows[static_cast<size_t>(qb)].push_back(static_cast<int32_t>(kb));
  }
  return PlannedMask{BlockMask::from_rows(mask_shape, rows), {}, {}};
}

void register_builtin_backends(BackendRegistry& registry) {
  registry.register_backend(make_dense_backend());
  registry.register_backend(make_block_sparse_backend());
  register_pattern_backends(registry);
}

}  // namespace tessel
