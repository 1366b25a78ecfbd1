// The DiT side of the sparse interface: DiTSparseAttentionAdapter (one per attention layer; knows the
// denoising step and its layer index, applies the sparsity schedule and the dense warm-up) and
// the drop-in SparseAttention module (resolves the backend from the config, shares plans across
// layers through a PlanCache, falls back to dense attention when given an explicit mask).
//
// Per forward, the adapter decides:
//   no backend (resolution "none")                → dense attention
//   step_density(config, step, total, layer) >= 1 → dense attention (warm-up or schedule)
//   otherwise → plan (cached by shape) → builder.update_step once per step → impl.forward
// The schedule's density for the step reaches the backend as metadata.spec.topk_ratio.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

#include "tessel/core/tensor.h"
#include "tessel/sparse/backend.h"
#include "tessel/sparse/config.h"
#include "tessel/sparse/registry.h"

namespace tessel {

// Plans keyed by (batch, seq_q, seq_kv, heads, kv heads, head dim, dtype, device) — plus the
// backend, module type and pattern (as the config's JSON), so one cache can serve several models.
// Layers of one shape share one plan. Thread-safe.
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
  std::shared_ptr<Metadata> get_or_plan(const Key& key, const std::function<std::shared_ptr<Metadata>()>& plan);

  int64_t hits() const;
  int64_t misses() const;
  size_t size() const;
  void clear();  // drops plans and zeroes the counters

  // The cache SparseAttention modules share when none is given.
  static std::shared_ptr<PlanCache> shared();

 private:
  mutable std::mutex mutex_;
  std::map<Key, std::shared_ptr<Metadata>> plans_;
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

  // Starts denoising step `step` of `total_steps` (0 <= step < total_steps; throws Error otherwise).
  void begin_step(int64_t step, int64_t total_steps);
  // Attention for this layer at the current step (without begin_step: no step warm-up, the
  // config's topk_ratio). q/k/v/out BSHD, lse optional. Throws Error on shape mismatch with the
  // heads/head_dim given at construction.
  AttentionStepReport forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                              const TensorView& lse = {});
  // Forgets the step (back to "no step begun") and the last report. Plans stay cached: they
  // depend only on shapes and config.
  void reset();

  int64_t layer_index() const { return layer_index_; }
  std::optional<int64_t> current_step() const { return step_; }
  int64_t total_steps() const { return total_steps_; }
  // The density the schedule gives this layer at the current step (1 = dense).
  double current_density() const;
  const std::shared_ptr<Backend>& backend() const { return backend_; }
  const std::shared_ptr<PlanCache>& plan_cache() const { return plan_cache_; }
  const ResolvedSparseAttnConfig& config() const { return config_; }
  const AttentionStepReport& last_report() const { return last_report_; }

 private:
  std::shared_ptr<Backend> backend_;
  std::unique_ptr<MetadataBuilder> builder_;
  std::unique_ptr<Impl> impl_;
  ModuleType module_;
  int64_t num_heads_, num_kv_heads_, head_dim_;
  ResolvedSparseAttnConfig config_;
  int64_t layer_index_;
  std::shared_ptr<PlanCache> plan_cache_;
  std::optional<int64_t> step_;
  int64_t total_steps_ = 0;
  AttentionStepReport last_report_;
};

// Dense attention honouring an explicit mask: uint8, nonzero = attend, shaped (B, S_kv)
// (key padding) or (B or 1, H_q or 1, S_q, S_kv). CPU tensors; rows with no allowed key give 0
// and lse -inf. Throws Error for other shapes or devices.
void masked_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& mask,
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
  std::shared_ptr<PlanCache> plan_cache;  // null = PlanCache::shared()
  BackendRegistry* registry = nullptr;    // required: the application's registry (not owned)
};

// The drop-in module: resolves its config and backend once (override > config > auto > none), then forwards
// through a DiTSparseAttentionAdapter.
class SparseAttention {
 public:
  explicit SparseAttention(SparseAttentionOptions options);

  void begin_step(int64_t step, int64_t total_steps) { adapter_.begin_step(step, total_steps); }
  void reset() { adapter_.reset(); }
  // With a non-empty attn_mask: dense masked attention, and one warning per module the first time.
  AttentionStepReport forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                              const TensorView& lse = {}, const TensorView& attn_mask = {});

  const Resolution& resolution() const { return resolution_; }
  DiTSparseAttentionAdapter& adapter() { return adapter_; }
  int64_t masked_fallbacks() const { return masked_fallbacks_; }

 private:
  ResolvedSparseAttnConfig config_;
  Resolution resolution_;
  DiTSparseAttentionAdapter adapter_;
  DType dtype_;
  int64_t masked_fallbacks_ = 0;
};

}  // namespace tessel
