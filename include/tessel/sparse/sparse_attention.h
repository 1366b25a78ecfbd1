// The DiT side of the sparse interface (docs/sparse_attention.md): DiTSparseAttentionAdapter (one per attention layer; knows its layer index,
// applies the sparsity schedule and the dense warm-up) and the drop-in SparseAttention module
// (resolves the backend from the config, shares plans across layers through a PlanCache, falls
// back to dense attention when given an explicit mask).
//
// Per forward(ctx, step, ...), the adapter decides:
//   no backend (resolution "none")                → dense attention
//   step_density(config, step, total, layer) >= 1 → dense attention (warm-up or schedule)
//   otherwise → plan (cached by shape) → impl.forward(ctx, ..., step with density)
// The schedule's density for the step reaches the backend as StepInfo::density. Neither the
// adapter nor the module keeps per-step state and plans are never modified after planning, so
// several threads (each with its own ExecContext: CFG branches, streams) may drive one module at
// once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "tessel/core/tensor.h"
#include "tessel/sparse/backend.h"
#include "tessel/sparse/config.h"
#include "tessel/sparse/registry.h"

namespace tessel {

// Plans keyed by (batch, seq_q, seq_kv, heads, kv heads, head dim, dtype, device) — plus the
// backend, module type and pattern (as the config's JSON), so one cache can serve several models.
// Layers of one shape share one plan. Thread-safe; the plans it holds are immutable. There is no
// process-wide cache: whoever wants layers to share plans passes them one cache.
class PlanCache {
 public:
  struct Key {
    int64_t batch, seq_q, seq_kv, num_qo_heads, num_kv_heads, head_dim;
    DType dtype;
    DeviceType device_type;
    int device_index;
    std::string backend;
    ModuleType module;
    std::string pattern;
    auto tie() const {
      return std::tie(batch, seq_q, seq_kv, num_qo_heads, num_kv_heads, head_dim, dtype, device_type,
                      device_index, backend, module, pattern);
    }
    bool operator<(const Key& other) const { return tie() < other.tie(); }
  };
  static Key make_key(const AttentionShape& shape, const std::string& backend, ModuleType module,
                      const std::string& pattern);

  // The cached plan for `key`, or the result of plan() stored under it.
  std::shared_ptr<const Metadata> get_or_plan(const Key& key, const std::function<std::shared_ptr<Metadata>()>& plan);

  int64_t hits() const;
  int64_t misses() const;
  size_t size() const;
  void clear();  // drops plans and zeroes the counters

 private:
  mutable std::mutex mutex_;
  std::map<Key, std::shared_ptr<const Metadata>> plans_;
  int64_t hits_ = 0;
  int64_t misses_ = 0;
};

// What one adapter forward did.
struct AttentionStepReport {
  std::string backend = "dense";  // backend that ran, or "dense"
  bool dense = true;    // the backend was bypassed for dense attention (no backend, warm-up, or density 1)
  double density = 1.0; // blocks computed / all blocks
  double estimate_ms = 0.0;
};

class DiTSparseAttentionAdapter {
 public:
  // backend null = dense attention. num_kv_heads 0 = num_heads. plan_cache null = a private one.
  DiTSparseAttentionAdapter(std::shared_ptr<Backend> backend, ModuleType module, int64_t num_heads,
                            int64_t num_kv_heads, int64_t head_dim, ResolvedSparseAttnConfig config, int64_t layer_index = 0,
                            std::shared_ptr<PlanCache> plan_cache = nullptr);

  // Attention for this layer at step `step` (step.step unset: no step warm-up, the config's
  // topk_ratio; step.layer and step.density are filled in by the adapter). q/k/v/out BSHD, lse
  // optional. Throws Error on shape mismatch with the heads/head_dim given at construction, or
  // for a step outside [0, total_steps). Grows ctx.workspace (when given) to what this shape
  // needs: the first call of a shape may allocate, later calls do not.
  AttentionStepReport forward(const ExecContext& ctx, const StepInfo& step, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& out, const TensorView& lse = {}) const;

  // Bytes of ctx.workspace that forward() at `step` reserves for tensors of `shape` (planning the
  // shape, through the plan cache, when the step runs sparse). For callers that hand forward() a
  // workspace that cannot grow (a suffix of theirs): reserve this much first.
  size_t workspace_bytes(const ExecContext& ctx, const StepInfo& step, const AttentionShape& shape) const;

  // For callers that run this layer's attention themselves on their share of the tokens
  // (sequence parallelism): the block mask forward() would execute at `step` for the global
  // tensors of `shape`, or nullopt when the layer runs dense at this step. A static pattern's mask
  // comes from the (cached) plan; a data-dependent one is estimated on the global q and k that
  // `global_qk` returns (called only then; on CUDA by the device estimator, then copied to the
  // host, which synchronizes ctx.stream). Throws Error when the backend cannot expose its mask
  // (plugins, token-permuted patterns).
  std::optional<BlockMask> executed_mask(const ExecContext& ctx, const StepInfo& step, const AttentionShape& shape,
                                         const std::function<std::pair<TensorView, TensorView>()>& global_qk) const;

  // For callers that split the queries over ranks and attend to each key shard themselves (Ring):
  // the mask forward() would execute at `step` for this rank's query rows q (B, S_q, H, D) against
  // every key k (B, S_kv, H_kv, D), estimated on the device and left there (stream order, no host
  // synchronization). These are the rows of the whole sequence's mask when q's first token starts
  // a query block of the sequence, because the estimate of a row reads only its own queries and
  // every key (keep_diagonal, which reads the row's position, is refused). nullopt when the layer
  // runs dense at this step. Throws Error naming what is missing when the backend has no device
  // estimator for this shape, or for keep_diagonal.
  std::optional<DeviceMaskEstimate> estimate_rows_on_device(const ExecContext& ctx, const StepInfo& step,
                                                            const TensorView& q, const TensorView& k) const;

  int64_t layer_index() const { return layer_index_; }
  // The density the schedule gives this layer at `step` (1 = dense).
  double density_at(const StepInfo& step) const;
  const std::shared_ptr<Backend>& backend() const { return backend_; }
  const std::shared_ptr<PlanCache>& plan_cache() const { return plan_cache_; }
  const ResolvedSparseAttnConfig& config() const { return config_; }

 private:
  void check_heads(const AttentionShape& shape, const char* what) const;
  // This shape's plan, from the plan cache (planned on a miss).
  std::shared_ptr<const Metadata> plan(const ExecContext& ctx, const AttentionShape& shape) const;

  std::shared_ptr<Backend> backend_;
  std::unique_ptr<MetadataBuilder> builder_;
  std::unique_ptr<Impl> impl_;
  ModuleType module_;
  int64_t num_heads_, num_kv_heads_, head_dim_;
  ResolvedSparseAttnConfig config_;
  int64_t layer_index_;
  std::shared_ptr<PlanCache> plan_cache_;
};

// Dense attention honouring an explicit mask: uint8, nonzero = attend, shaped (B, S_kv)
// (key padding) or (B or 1, H_q or 1, S_q, S_kv). CPU tensors; rows with no allowed key give 0
// and lse -inf. Throws Error for other shapes or devices.
void masked_attention_forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& mask,
                              const TensorView& out, const TensorView& lse, float scale = 0.0f);

struct SparseAttentionOptions {
  int64_t num_heads = 1;
  int64_t head_dim = 64;
  int64_t num_kv_heads = 0;  // 0 = num_heads
  ModuleType module = ModuleType::kDitSelf;
  SparseAttnConfig config;
  std::string backend_override;  // "" = none; the app passes TESSEL_SPARSE_ATTN_BACKEND here
  DType dtype = DType::kF16; // element type of q/k/v (forward checks it)
  Device device{};           // device the layer runs on (used to resolve the backend)
  int64_t layer_index = 0;
  std::shared_ptr<PlanCache> plan_cache;  // null = a cache of this module's own
  BackendRegistry* registry = nullptr;    // required: the application's registry (not owned)
};

// The drop-in module: resolves its config and backend once (override > config > auto > none), then
// forwards through a DiTSparseAttentionAdapter. forward() is safe to call from several threads at once.
class SparseAttention {
 public:
  explicit SparseAttention(SparseAttentionOptions options);

  // With a non-empty attn_mask: dense masked attention, and one warning (through ctx) per module
  // the first time.
  AttentionStepReport forward(const ExecContext& ctx, const StepInfo& step, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& out, const TensorView& lse = {},
                              const TensorView& attn_mask = {}) const;

  // What forward() at `step` reserves of ctx.workspace for tensors of `shape` (see the adapter's).
  size_t workspace_bytes(const ExecContext& ctx, const StepInfo& step, const AttentionShape& shape) const {
    return adapter_.workspace_bytes(ctx, step, shape);
  }

  const Resolution& resolution() const { return resolution_; }
  const DiTSparseAttentionAdapter& adapter() const { return adapter_; }
  int64_t masked_fallbacks() const { return masked_fallbacks_->load(); }

 private:
  ResolvedSparseAttnConfig config_;
  Resolution resolution_;
  DiTSparseAttentionAdapter adapter_;
  DType dtype_;
  // Counted by concurrent forwards; behind a pointer so the module stays movable.
  std::unique_ptr<std::atomic<int64_t>> masked_fallbacks_ = std::make_unique<std::atomic<int64_t>>(0);
};

}  // namespace tessel
