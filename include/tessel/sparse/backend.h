// The sparse-attention protocol (docs/sparse_attention.md) in C++: a Backend is a factory that names what it supports and
// makes a MetadataBuilder (plan: shapes + pattern -> Metadata, once per shape) and an Impl
// (forward: q, k, v + Metadata + StepInfo -> out, every call). Built-in backends and plugins
// loaded from shared libraries (plugin/tessel_plugin.h, wrapped by the registry) implement the
// same interface.
//
// Plans are immutable once built: forward() never changes a Metadata, so one plan may be shared
// by every layer of a shape and used by several threads (each with its own ExecContext) at once.
// What changes per call (denoising step, layer, CFG branch, the schedule's density) arrives as a
// StepInfo argument.
//
// Tensors are BSHD views (docs/architecture.md): q (B, S_q, H_q, D); k, v (B, S_kv, H_kv, D); out like q; lse optional
// fp32 (B, H_q, S_q), or an empty TensorView{}.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/device.h"
#include "tessel/core/exec_context.h"
#include "tessel/core/dtype.h"
#include "tessel/core/tensor.h"
#include "tessel/sparse/block_mask.h"
#include "tessel/sparse/config.h"
#include "tessel/sparse/pattern.h"

namespace tessel {

enum class ModuleType : uint8_t { kDitSelf, kDitCross, kDitJoint, kLlmPrefill, kLlmDecode };
inline constexpr int kNumModuleTypes = 5;
std::string_view module_type_name(ModuleType type);  // "dit_self", "dit_cross", "dit_joint", "llm_prefill", "llm_decode"
ModuleType parse_module_type(std::string_view name);  // throws Error listing the names
const std::vector<ModuleType>& all_module_types();
std::string_view device_type_name(DeviceType type);   // "cpu", "cuda"

// The shapes plan() sees (the plan arguments after pattern and module type).
struct AttentionShape {
  int64_t batch = 1;
  int64_t num_qo_heads = 1;
  int64_t num_kv_heads = 1;
  int64_t head_dim = 64;
  int64_t seq_q = 0;
  int64_t seq_kv = 0;
  DType dtype = DType::kF16;
  Device device{};

  // Throws Error unless sizes are >= 1 and num_qo_heads % num_kv_heads == 0.
  void validate() const;
  // The shape of these q/k/v views (checks they agree: batch, heads, head dim, dtype, device).
  static AttentionShape of(const TensorView& q, const TensorView& k, const TensorView& v);
  bool operator==(const AttentionShape&) const = default;
  std::string str() const;  // "B=1 Sq=128 Skv=128 Hq=8 Hkv=8 D=64 fp16 cpu"
};

// What a plan produced. Backends derive from it to keep their own state (workspaces, plugin
// handles). The common fields let tools and the adapter report what will run.
struct Metadata {
  virtual ~Metadata();

  std::string backend;        // name of the backend that planned it
  PatternSpec spec;           // the pattern planned
  ModuleType module = ModuleType::kDitSelf;
  AttentionShape shape;

  // Static masks: the mask forward() will execute, in the permuted token order when
  // `permutation` is set. Null for dense or data-dependent patterns.
  std::shared_ptr<const BlockMask> mask;
  // Optional token reordering (spatial_aware): q/k/v token t of the permuted sequence is token
  // permutation[t] of the user's sequence; the output is mapped back. Empty = identity. Only for
  // seq_q == seq_kv (self attention).
  std::vector<int64_t> permutation;

  // Fills the four common fields above with what a backend's builder was asked to plan.
  void set_request(std::string backend_name, const PatternSpec& planned_spec, ModuleType planned_module,
                   const AttentionShape& planned_shape);
  // Density the plan keeps (kept blocks / all blocks): mask->density(), 1 for dense, or the
  // target ratio for data-dependent patterns until a forward has run.
  double planned_density() const;
  // Bytes of ctx.workspace one forward of this plan takes under ctx (CPU scratch; 0 on CUDA).
  // The adapter reserves it before forwarding; callers driving an Impl directly may do the same
  // (without a workspace, forward allocates its scratch per call).
  virtual size_t workspace_bytes(const ExecContext& ctx) const;
};

// Where one forward call sits in the denoising loop. Passed to Impl::forward; plans never hold it.
struct StepInfo {
  std::optional<int64_t> step;  // denoising step in [0, total_steps); unset: no step schedule
  int64_t total_steps = 0;
  int64_t layer = 0;            // transformer layer index
  int cfg_branch = 0;           // classifier-free guidance branch (0 conditional, 1 unconditional)
  // The density (top-k ratio) the sparsity schedule gives this step and layer; unset: the plan's
  // spec.topk_ratio. Data-dependent backends select this fraction of blocks.
  std::optional<double> density;

  static StepInfo at(int64_t step, int64_t total_steps, int64_t layer = 0, int cfg_branch = 0) {
    StepInfo info;
    info.step = step;
    info.total_steps = total_steps;
    info.layer = layer;
    info.cfg_branch = cfg_branch;
    return info;
  }
};

// Measured by one forward call (data-dependent backends fill estimate_ms).
struct ForwardStats {
  double density = 1.0;      // blocks computed / all blocks
  double estimate_ms = 0.0;  // time spent choosing blocks inside forward
};

// A mask estimated on the device for the caller to attend with (Impl::estimate_on_device): a view
// of the plan's device mask, valid in stream order until the next estimate of the plan.
struct DeviceMaskEstimate {
  BlockMaskView view;
  ForwardStats stats;  // of the latest estimate of this plan that has finished (not always this one)
};

class MetadataBuilder {
 public:
  virtual ~MetadataBuilder();
  // Builds everything forward() needs for this pattern and shape. Validates the spec and shape
  // and throws Error for what this backend cannot run. May allocate (device masks, plugin state);
  // the plan it returns is immutable.
  virtual std::shared_ptr<Metadata> plan(const ExecContext& ctx, const PatternSpec& spec, ModuleType module,
                                         const AttentionShape& shape) = 0;
  // The positional form (pattern, module type, then the shapes).
  std::shared_ptr<Metadata> plan(const ExecContext& ctx, const PatternSpec& spec, ModuleType module,
                                 int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim, int64_t seq_q,
                                 int64_t seq_kv, int64_t batch = 1, DType dtype = DType::kF16,
                                 Device device = Device::cpu());
};

class Impl {
 public:
  virtual ~Impl();
  // Writes out (and lse when not empty) for the step `step`, on ctx's stream / threads. Must not
  // modify `metadata` (other threads may be using it). Throws Error for bad input and writes
  // nothing then.
  virtual ForwardStats forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                               const Metadata& metadata, const StepInfo& step, const TensorView& out,
                               const TensorView& lse) = 0;
  // For callers that run the attention themselves (sequence parallelism cuts the mask per rank):
  // the block mask forward() would execute on the global q and k with this plan and step, in the
  // caller's token order. nullopt when the backend cannot expose it: the default (plugins). A mask
  // estimated on the device is estimated there and copied to the host (synchronizing ctx.stream).
  virtual std::optional<BlockMask> executed_mask(const ExecContext& ctx, const TensorView& q, const TensorView& k,
                                                 const Metadata& metadata, const StepInfo& step);
  // For callers that split the queries over ranks and attend to each key shard themselves (Ring):
  // the mask forward() would execute for these q rows against these k, estimated on the device into
  // the plan's mask and left there (stream order, no host synchronization). nullopt when the plan
  // has no device estimate: the default (host estimators, static masks, plugins).
  virtual std::optional<DeviceMaskEstimate> estimate_on_device(const ExecContext& ctx, const TensorView& q,
                                                               const TensorView& k, const Metadata& metadata,
                                                               const StepInfo& step);
};

class Backend {
 public:
  virtual ~Backend();

  virtual std::string name() const = 0;
  virtual std::vector<PatternType> supported_patterns() const = 0;
  virtual std::vector<ModuleType> supported_module_types() const = 0;
  virtual std::vector<DeviceType> supported_devices() const = 0;
  // Auto-selection rank: the highest-scoring backend that supports the request wins; a negative
  // score means "never chosen automatically" (the dense oracle). Ties go to the earlier registered.
  virtual int score() const { return 0; }
  // "built-in", or the path of the shared library it came from.
  virtual std::string origin() const { return "built-in"; }
  // Rejects configs this backend cannot honour (throws Error). Default: accepts everything.
  virtual void validate_config(const ResolvedSparseAttnConfig& config) const;

  virtual std::unique_ptr<MetadataBuilder> make_metadata_builder() const = 0;
  virtual std::unique_ptr<Impl> make_impl() const = 0;

  bool supports(PatternType pattern) const;
  bool supports(ModuleType module) const;
  bool supports(DeviceType device) const;
};

// The checks every plan() starts with: shape.validate(), spec.validate(), and that `backend`
// supports the pattern type, the module type and the device. Throws Error naming the backend,
// what it supports and what was asked.
void check_plan_request(const Backend& backend, const PatternSpec& spec, ModuleType module, const AttentionShape& shape);
// Throws Error unless q/k/v have the shape `metadata` was planned for.
void check_forward_shape(const Metadata& metadata, const TensorView& q, const TensorView& k, const TensorView& v);

}  // namespace tessel
