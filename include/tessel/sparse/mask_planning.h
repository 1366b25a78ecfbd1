// The extension point for pattern backends: write a function that chooses blocks, get a whole
// Backend (plan, forward on the block-sparse kernel, permutation handling, always-keep options,
// statistics) for free.
//
//   Static pattern (mask depends only on shapes and spec; planned once per shape, cached):
//     PlannedMask plan_radial(const PatternSpec& spec, ModuleType module, const AttentionShape& shape);
//     registry.register_backend(make_mask_planning_backend({"radial", {PatternType::kRadial}}, plan_radial));
//
//   Dynamic pattern (mask depends on q and k; estimated inside every forward):
//     BlockMask estimate_topk(const ExecContext& ctx, const TensorView& q, const TensorView& k,
//                             const PatternSpec& spec, const StepInfo& step, const AttentionShape& shape);
//     registry.register_backend(make_mask_estimating_backend({"dynamic_topk", {PatternType::kDynamicTopk}},
//                                                            estimate_topk));
//
// The planner/estimator returns a BlockMask with block sizes spec.block_q/spec.block_kv over
// (seq_q, seq_kv), mask_batch ∈ {1, B}, mask_heads ∈ {1, H_kv, H_q}. The backend then unions in
// the always-keep blocks (apply_always_keep), checks the mask's geometry against the shape
// (Error naming the backend otherwise), and runs block_sparse_attention_forward on the tensors'
// device. A planner may also return a token permutation (spatial_aware); forward then gathers
// q/k/v into that order, attends with the mask (which is in permuted order), and scatters the
// output and lse back, so callers never see the permutation (the gathered copies live in the
// context's workspace: permuted_attention_workspace_bytes). The estimator receives the step as a
// StepInfo; step.density is the schedule's density for it (unset: spec.topk_ratio).
// forward() reports ForwardStats{density of the executed mask, estimate_ms of the estimator}.
//
// CUDA tensors: a dynamic backend made with a DeviceMaskEstimator estimates on the device. Plan
// allocates a DeviceEstimatedMask for (B, H_q, S_q, S_kv, block_q, block_kv) and runs the device
// estimator's check (an unsupported option is an Error at plan time, never a silent host
// fallback); forward refills the mask with kernels on ctx.stream and runs the CUDA
// block-sparse kernel on it, without synchronizing with the host, so it can be captured in a
// CUDA graph. The device mask buffer belongs to the plan: callers that share a CUDA plan of a
// dynamic backend must run it on one stream (CPU plans have no such state). The
// ForwardStats of a CUDA forward are read lazily (CUDA events, no synchronization): those of the
// latest earlier forward of the plan whose estimate has finished; before any has, density is the
// plan's target and estimate_ms 0; forwards captured in a graph are not measured.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessel/sparse/backend.h"

namespace tessel {

struct PlannedMask {
  BlockMask mask;
  std::vector<int64_t> permutation;  // empty = identity; else a permutation of [0, seq)
  // Token-level masks inside mask's kept blocks, in the kernels' bit layout (sub_block_mask.h);
  // empty = kept blocks are computed whole. Blocks the always-keep options add are whole.
  std::vector<uint32_t> sub_block_bits;
};

using MaskPlanner = std::function<PlannedMask(const PatternSpec& spec, ModuleType module, const AttentionShape& shape)>;
using MaskEstimator = std::function<BlockMask(const ExecContext& ctx, const TensorView& q, const TensorView& k,
                                              const PatternSpec& spec, const StepInfo& step,
                                              const AttentionShape& shape)>;

class DeviceEstimatedMask;

// The device form of a dynamic estimator (see above).
struct DeviceMaskEstimator {
  // Plan time: throws Error naming the spec option or shape field the device estimator cannot
  // run. Runs after check_plan_request and before the mask is allocated.
  std::function<void(const PatternSpec& spec, const AttentionShape& shape)> check;
  // Forward: refills `mask` from q and k (CUDA tensors), always-keep blocks included — the
  // host-side apply_always_keep does not run on this path. Must not synchronize with the host.
  std::function<void(const ExecContext& ctx, const TensorView& q, const TensorView& k, const PatternSpec& spec,
                     const StepInfo& step, DeviceEstimatedMask& mask)>
      estimate;
};

// What a pattern backend declares about itself.
struct PatternBackendInfo {
  std::string name;
  std::vector<PatternType> patterns;
  std::vector<ModuleType> modules = all_module_types();
  std::vector<DeviceType> devices = default_devices();
  int score = 10;  // built-in pattern backends rank above plugins' default 0 for their own patterns
  // Optional: rejects configs the pattern cannot run (called when the backend is resolved), e.g.
  // a missing spatial_layout. Throws Error naming the field.
  std::function<void(const ResolvedSparseAttnConfig& config)> validate_config;

  static std::vector<DeviceType> default_devices();  // cpu, plus cuda when compiled with CUDA
};

std::shared_ptr<Backend> make_mask_planning_backend(PatternBackendInfo info, MaskPlanner planner);
std::shared_ptr<Backend> make_mask_estimating_backend(PatternBackendInfo info, MaskEstimator estimator);
// The same with the device path for CUDA tensors (the host estimator serves CPU tensors).
std::shared_ptr<Backend> make_mask_estimating_backend(PatternBackendInfo info, MaskEstimator estimator,
                                                      DeviceMaskEstimator device_estimator);

// The mask the latest forward of a CUDA plan of a device-estimating backend computed, copied to
// the host (synchronizes): for tests and inspection. Throws Error for any other metadata.
BlockMask device_estimated_mask(const Metadata& metadata);

// The spec's always-keep blocks (keep_diagonal, sink_blocks, keep_text with num_text_tokens and
// text_first) unioned into `mask`. Returns `mask` unchanged when none is asked for.
BlockMask apply_always_keep(const PatternSpec& spec, const BlockMask& mask);

// The kv blocks [first, last] overlapping q block `q_block`'s own token range with bottom-right
// alignment (shift = seq_kv - seq_q), clamped to the kv range; first > last when none overlaps.
struct BlockRange {
  int64_t first = 0;
  int64_t last = -1;
};
BlockRange diagonal_kv_blocks(const BlockMaskShape& shape, int64_t q_block);

// Checks a planner's or estimator's mask against the attention shape and spec: block sizes,
// seq_q/seq_kv, mask_batch ∈ {1, B}, mask_heads ∈ {1, H_kv, H_q}. Throws Error naming `who`.
void check_mask_geometry(const BlockMask& mask, const PatternSpec& spec, const AttentionShape& shape,
                         const std::string& who);

}  // namespace tessel
