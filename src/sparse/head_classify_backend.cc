// The head_classify backend (RainFusion-style head classification, estimators/head_classifier.h):
// plan time plans the three class masks in one token order; a forward probes the heads (on the
// first forward of a layer and CFG branch, then every probe_interval denoising steps, reusing
// the classes in between), gives each head its class mask and runs block-sparse attention in the
// permuted order. CPU tensors (token permutations are gathered on the host).
#include <chrono>
#include <optional>
#include <map>
#include <mutex>

#include "spec_options.h"
#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"
#include "tessel/sparse/estimators/head_classifier.h"
#include "tessel/sparse/mask_planning.h"
#include "tessel/sparse/pattern_backends.h"
#include "token_permutation.h"

namespace tessel {
namespace {

constexpr const char* kName = "head_classify";

// The classes of one (layer, CFG branch) and the mask they give, as of a probe at `step`.
struct ClassifiedHeads {
  std::optional<int64_t> step;
  std::vector<HeadClass> classes;
  std::shared_ptr<const BlockMask> mask;
};

struct HeadClassifyMetadata : Metadata {
  HeadClassifierOptions options;
  int64_t probe_interval = 5;
  HeadClassPlans plans;
  std::vector<int64_t> inverse_permutation;

  // Classes cached between steps; guarded by `mutex` (plans are shared by threads and layers).
  mutable std::mutex mutex;
  mutable std::map<std::pair<int64_t, int>, ClassifiedHeads> classified;

  size_t workspace_bytes(const ExecContext& ctx) const override {
    return permuted_attention_workspace_bytes(ctx, shape, spec.block_kv, /*with_lse=*/true);
  }
};

// True when the classes probed at `cached` may serve `step`: same denoising run, fewer than
// `interval` steps later. Forwards without a step probe every time.
bool still_valid(const ClassifiedHeads& cached, const StepInfo& step, int64_t interval) {
  if (!cached.step || !step.step) return false;
  return *step.step >= *cached.step && *step.step - *cached.step < interval;
}

class HeadClassifyBuilder : public MetadataBuilder {
 public:
  explicit HeadClassifyBuilder(std::shared_ptr<const Backend> backend) : backend_(std::move(backend)) {}

  std::shared_ptr<Metadata> plan(const ExecContext&, const PatternSpec& spec, ModuleType module,
                                 const AttentionShape& shape) override {
    check_plan_request(*backend_, spec, module, shape);
    const TokenLayout layout = token_layout_from_spec(spec);
    if (shape.seq_q != layout.seq_len() || shape.seq_kv != layout.seq_len())
      fail_argument("backend 'head_classify' sequence lengths",
                    detail::concat(layout.seq_len(), " queries and keys (the spatial_layout's tokens)"),
                    detail::concat(shape.seq_q, " queries, ", shape.seq_kv, " keys"));
    if (!shape.device.is_cpu())
      fail_argument("backend 'head_classify' device", "cpu (its token permutation is gathered on the host)",
                    shape.device.str());
    if (!spec.sub_block_mask.empty())
      fail_argument("pattern.sub_block_mask", "empty (backend 'head_classify' computes whole blocks)",
                    detail::concat(spec.sub_block_mask.size(), " entries"));
    auto metadata = std::make_shared<HeadClassifyMetadata>();
    metadata->options = head_classifier_options_from_spec(spec);
    metadata->probe_interval = option_int(spec, "probe_interval", 5);
    if (metadata->probe_interval < 1) fail_argument("pattern.options.probe_interval", ">= 1", metadata->probe_interval);
    metadata->plans = plan_head_classes(layout, metadata->options);
    const TokenPermutation& permutation = metadata->plans.plan.permutation;
    metadata->permutation.assign(permutation.order.begin(), permutation.order.end());
    metadata->inverse_permutation.assign(permutation.inverse.begin(), permutation.inverse.end());
    metadata->set_request(kName, spec, module, shape);
    return metadata;
  }

 private:
  std::shared_ptr<const Backend> backend_;
};

class HeadClassifyImpl : public Impl {
 public:
  ForwardStats forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                       const Metadata& metadata, const StepInfo& step, const TensorView& out,
                       const TensorView& lse) override {
    const auto* plan = dynamic_cast<const HeadClassifyMetadata*>(&metadata);
    if (plan == nullptr) fail_argument("metadata", "a plan made by backend 'head_classify'", "foreign metadata");
    check_forward_shape(metadata, q, k, v);
    const std::pair<int64_t, int> key{step.layer, step.cfg_branch};
    std::shared_ptr<const BlockMask> mask;
    {
      std::lock_guard<std::mutex> lock(plan->mutex);
      const auto found = plan->classified.find(key);
      if (found != plan->classified.end() && still_valid(found->second, step, plan->probe_interval))
        mask = found->second.mask;
    }
    double estimate_ms = 0.0;
    if (!mask) {
      const auto start = std::chrono::steady_clock::now();
      HeadProbe probe = probe_head_classes(ctx, q, k, plan->plans, plan->options);
      mask = std::make_shared<const BlockMask>(apply_always_keep(plan->spec, head_class_mask(plan->plans, probe.classes)));
      estimate_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      std::lock_guard<std::mutex> lock(plan->mutex);
      plan->classified[key] = ClassifiedHeads{step.step, std::move(probe.classes), mask};
    }
    const BlockMaskView view = mask->view();
    if (plan->permutation.empty()) {
      block_sparse_attention_forward(ctx, q, k, v, view, out, lse);
    } else {
      permuted_block_sparse_attention(ctx, q, k, v, view, plan->permutation, plan->inverse_permutation, out, lse);
    }
    return ForwardStats{mask->density(), estimate_ms};
  }
};

class HeadClassifyBackend : public Backend, public std::enable_shared_from_this<HeadClassifyBackend> {
 public:
  std::string name() const override { return kName; }
  std::vector<PatternType> supported_patterns() const override { return {PatternType::kHeadClassify}; }
  std::vector<ModuleType> supported_module_types() const override { return {ModuleType::kDitSelf}; }
  std::vector<DeviceType> supported_devices() const override { return {DeviceType::kCPU}; }
  int score() const override { return 10; }
  void validate_config(const ResolvedSparseAttnConfig& config) const override {
    if (!config.pattern().spatial_layout)
      throw Error("sparse_attn.geometry.spatial_layout: required by backend 'head_classify' (the latent grid), but not set");
  }
  std::unique_ptr<MetadataBuilder> make_metadata_builder() const override {
    return std::make_unique<HeadClassifyBuilder>(shared_from_this());
  }
  std::unique_ptr<Impl> make_impl() const override { return std::make_unique<HeadClassifyImpl>(); }
};

}  // namespace

HeadClassifierOptions head_classifier_options_from_spec(const PatternSpec& spec) {
  HeadClassifierOptions o;
  o.probe_rows = option_int(spec, "probe_rows", o.probe_rows);
  o.min_frame_mass = option_double(spec, "min_frame_mass", o.min_frame_mass);
  o.min_temporal_lift = option_double(spec, "min_temporal_lift", o.min_temporal_lift);
  o.spatial_frame_radius = option_int(spec, "spatial_frame_radius", o.spatial_frame_radius);
  o.spatial_radius = spec.spatial_radius.value_or(o.spatial_radius);
  o.temporal_radius = option_int(spec, "temporal_radius", o.temporal_radius);
  o.temporal_frame_radius = option_int(spec, "temporal_frame_radius", o.temporal_frame_radius);
  o.ordering = parse_spatial_ordering(spec.option("ordering", std::string(spatial_ordering_name(o.ordering))));
  o.block_q = spec.block_q;
  o.block_kv = spec.block_kv;
  o.validate();
  return o;
}

std::shared_ptr<Backend> make_head_classify_backend() { return std::make_shared<HeadClassifyBackend>(); }

}  // namespace tessel
