#include "tessel/sparse/sparse_attention.h"

#include "tessel/core/error.h"
#include "tessel/core/log.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/attention_tuning.h"
#include "tessel/sparse/schedule.h"

namespace tessel {

// ---- PlanCache ---------------------------------------------------------------------------------

PlanCache::Key PlanCache::make_key(const AttentionShape& shape, const std::string& backend, ModuleType module,
                                   const std::string& pattern) {
  return Key{shape.batch,       shape.seq_q,        shape.seq_kv, shape.num_qo_heads, shape.num_kv_heads,
             shape.head_dim,    shape.dtype,        shape.device.type, shape.device.index, backend,
             module,            pattern};
}

std::shared_ptr<const Metadata> PlanCache::get_or_plan(const Key& key,
                                                       const std::function<std::shared_ptr<Metadata>()>& plan) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = plans_.find(key);
    if (it != plans_.end()) {
      ++hits_;
      return it->second;
    }
  }
  // Plan outside the lock (it can be slow); if two threads race, the first stored plan wins.
  std::shared_ptr<const Metadata> planned = plan();
  std::lock_guard<std::mutex> lock(mutex_);
  const auto [it, inserted] = plans_.emplace(key, std::move(planned));
  if (inserted) ++misses_;
  else ++hits_;
  return it->second;
}

int64_t PlanCache::hits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hits_;
}
int64_t PlanCache::misses() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return misses_;
}
size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return plans_.size();
}
void PlanCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  plans_.clear();
  hits_ = misses_ = 0;
}

// ---- DiTSparseAttentionAdapter -------------------------------------------------------------

DiTSparseAttentionAdapter::DiTSparseAttentionAdapter(std::shared_ptr<Backend> backend, ModuleType module,
                                                     int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                                     ResolvedSparseAttnConfig config, int64_t layer_index,
                                                     std::shared_ptr<PlanCache> plan_cache)
    : backend_(std::move(backend)),
      module_(module),
      num_heads_(num_heads),
      num_kv_heads_(num_kv_heads == 0 ? num_heads : num_kv_heads),
      head_dim_(head_dim),
      config_(std::move(config)),
      layer_index_(layer_index),
      plan_cache_(plan_cache ? std::move(plan_cache) : std::make_shared<PlanCache>()) {
  if (num_heads_ < 1) fail_argument("num_heads", ">= 1", num_heads_);
  if (num_kv_heads_ < 1 || num_heads_ % num_kv_heads_ != 0)
    fail_argument("num_kv_heads", "a divisor of num_heads (" + std::to_string(num_heads_) + ")", num_kv_heads_);
  if (head_dim_ < 1) fail_argument("head_dim", ">= 1", head_dim_);
  if (layer_index_ < 0) fail_argument("layer_index", ">= 0", layer_index_);
  if (backend_) {
    backend_->validate_config(config_);
    builder_ = backend_->make_metadata_builder();
    impl_ = backend_->make_impl();
  }
}

double DiTSparseAttentionAdapter::density_at(const StepInfo& step) const {
  const SparseAttnConfig& config = config_.config();
  if (step.step) return step_density(config, *step.step, step.total_steps, layer_index_);
  return layer_index_ < config.warmup.dense_layers ? 1.0 : config.selection.topk_ratio;
}

namespace {

size_t dense_workspace_bytes(const ExecContext& ctx, const AttentionShape& shape) {
  const AttentionDims dims{shape.batch, shape.seq_q, shape.seq_kv, shape.num_qo_heads, shape.num_kv_heads, shape.head_dim};
  return attention_workspace_bytes(ctx, shape.device, dims);
}

}  // namespace

// Every head, or one rank's group of them under Ulysses (the same ratio of query to kv heads): the
// patterns and estimators work per head, so a group's mask is the same rows of the whole one.
void DiTSparseAttentionAdapter::check_heads(const AttentionShape& shape, const char* what) const {
  const bool group = shape.num_qo_heads > 0 && shape.num_kv_heads > 0 && num_heads_ % shape.num_qo_heads == 0 &&
                     num_kv_heads_ % shape.num_kv_heads == 0 && num_heads_ / shape.num_qo_heads == num_kv_heads_ / shape.num_kv_heads;
  if (!group)
    fail_argument(detail::concat(what, " heads (q / kv)"), detail::concat(num_heads_, " / ", num_kv_heads_, " or a group of them"),
                  detail::concat(shape.num_qo_heads, " / ", shape.num_kv_heads));
  if (shape.head_dim != head_dim_) fail_argument(detail::concat(what, " head_dim"), head_dim_, shape.head_dim);
}

std::shared_ptr<const Metadata> DiTSparseAttentionAdapter::plan(const ExecContext& ctx, const AttentionShape& shape) const {
  const PlanCache::Key key = PlanCache::make_key(shape, backend_->name(), module_, config_.json());
  return plan_cache_->get_or_plan(key, [&] { return builder_->plan(ctx, config_.pattern(), module_, shape); });
}

size_t DiTSparseAttentionAdapter::workspace_bytes(const ExecContext& ctx, const StepInfo& step,
                                                  const AttentionShape& shape) const {
  check_heads(shape, "shape");
  const double density = density_at(step);
  // A plan-time point: the kernel variant of this shape's calls is tuned here when the process
  // enabled tuning (attention_tuning.h; nothing happens otherwise).
  const AttentionDims dims{shape.batch, shape.seq_q, shape.seq_kv, shape.num_qo_heads, shape.num_kv_heads, shape.head_dim};
  const bool sparse = backend_ && density < 1.0;
  tune_attention_if_enabled(ctx, shape.device, shape.dtype, dims, {sparse, sparse ? density : 1.0, false, 5});
  if (!sparse) return dense_workspace_bytes(ctx, shape);
  return plan(ctx, shape)->workspace_bytes(ctx);
}

AttentionStepReport DiTSparseAttentionAdapter::forward(const ExecContext& ctx, const StepInfo& step,
                                                       const TensorView& q, const TensorView& k, const TensorView& v,
                                                       const TensorView& out, const TensorView& lse) const {
  const AttentionShape shape = AttentionShape::of(q, k, v);
  check_heads(shape, "q/k/v");

  const double density = density_at(step);  // validates the step
  AttentionStepReport report;
  if (!backend_ || density >= 1.0) {
    if (ctx.workspace != nullptr) ctx.workspace->reserve(dense_workspace_bytes(ctx, shape));
    attention_forward(ctx, q, k, v, out, lse);
    return report;
  }
  const std::shared_ptr<const Metadata> metadata = plan(ctx, shape);
  if (ctx.workspace != nullptr) ctx.workspace->reserve(metadata->workspace_bytes(ctx));
  StepInfo this_layer = step;
  this_layer.layer = layer_index_;
  this_layer.density = density;
  const ForwardStats stats = impl_->forward(ctx, q, k, v, *metadata, this_layer, out, lse);
  report.backend = backend_->name();
  report.dense = false;
  report.density = stats.density;
  report.estimate_ms = stats.estimate_ms;
  return report;
}

std::optional<BlockMask> DiTSparseAttentionAdapter::executed_mask(
    const ExecContext& ctx, const StepInfo& step, const AttentionShape& shape,
    const std::function<std::pair<TensorView, TensorView>()>& global_qk) const {
  check_heads(shape, "shape");
  const double density = density_at(step);  // validates the step
  if (!backend_ || density >= 1.0) return std::nullopt;
  const std::shared_ptr<const Metadata> metadata = plan(ctx, shape);
  const auto unexposed = [&](const char* why) {
    fail_argument("sparse attention backend '" + backend_->name() + "' under sequence parallelism",
                  "a backend whose block mask can be cut per rank", why);
  };
  if (!metadata->permutation.empty()) unexposed("a token-permuted pattern");
  if (metadata->mask) return *metadata->mask;
  StepInfo this_layer = step;
  this_layer.layer = layer_index_;
  this_layer.density = density;
  const auto [q, k] = global_qk();
  std::optional<BlockMask> mask = impl_->executed_mask(ctx, q, k, *metadata, this_layer);
  if (!mask) unexposed("a mask it does not expose (a plugin's)");
  return mask;
}

std::optional<DeviceMaskEstimate> DiTSparseAttentionAdapter::estimate_rows_on_device(const ExecContext& ctx,
                                                                                    const StepInfo& step,
                                                                                    const TensorView& q,
                                                                                    const TensorView& k) const {
  const AttentionShape shape = AttentionShape::of(q, k, k);
  check_heads(shape, "q/k");
  const double density = density_at(step);  // validates the step
  if (!backend_ || density >= 1.0) return std::nullopt;
  if (config_.pattern().keep_diagonal)
    fail_argument("sparse attention keep_diagonal with the query rows split over ranks", "false (a row's diagonal block depends on its position)",
                  "true");
  const std::shared_ptr<const Metadata> metadata = plan(ctx, shape);
  StepInfo this_layer = step;
  this_layer.layer = layer_index_;
  this_layer.density = density;
  std::optional<DeviceMaskEstimate> mask = impl_->estimate_on_device(ctx, q, k, *metadata, this_layer);
  if (!mask)
    fail_argument("sparse attention backend '" + backend_->name() + "' with the query rows split over ranks",
                  "a backend that estimates its mask on the device (dynamic_topk, threshold on CUDA)",
                  detail::concat("none for this plan on ", shape.device.str()));
  return mask;
}

// ---- SparseAttention -------------------------------------------------------------------------

namespace {

Resolution resolve_for(const SparseAttentionOptions& options, const ResolvedSparseAttnConfig& config) {
  if (!options.registry)
    fail_argument("SparseAttentionOptions::registry", "the application's BackendRegistry", "null");
  return options.registry->resolve(config, options.module, options.device, options.backend_override);
}

}  // namespace

SparseAttention::SparseAttention(SparseAttentionOptions options)
    : config_(options.config),
      resolution_(resolve_for(options, config_)),
      adapter_(resolution_.backend, options.module, options.num_heads, options.num_kv_heads, options.head_dim,
               config_, options.layer_index, options.plan_cache),
      dtype_(options.dtype) {}

AttentionStepReport SparseAttention::forward(const ExecContext& ctx, const StepInfo& step, const TensorView& q,
                                             const TensorView& k, const TensorView& v, const TensorView& out,
                                             const TensorView& lse, const TensorView& attn_mask) const {
  check_dtype(q, dtype_, "q");
  if (attn_mask.empty()) return adapter_.forward(ctx, step, q, k, v, out, lse);
  masked_attention_forward(ctx, q, k, v, attn_mask, out, lse);
  if (masked_fallbacks_->fetch_add(1) == 0)
    ctx.log(LogLevel::kWarning, "SparseAttention layer " + std::to_string(adapter_.layer_index()) +
                ": an explicit attention mask was given, so sparse attention" +
                (resolution_.backend ? " (backend '" + resolution_.backend->name() + "')" : std::string()) +
                " is bypassed and dense attention runs; this warning is shown once per layer");
  return AttentionStepReport{};
}

}  // namespace tessel
