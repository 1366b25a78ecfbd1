#include "tessel/sparse/mask_planning.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"
#include "tessel/sparse/sub_block_mask.h"
#include "token_permutation.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>

#include "device_estimate_state.h"
#include "tessel/sparse/estimators/device_mask_estimation.h"
#endif

namespace tessel {
namespace {

// A static plan: the mask (plus its device copy for CUDA tensors) and the token permutation.
struct MaskMetadata : Metadata {
  std::optional<BlockMask::DeviceCopy> device_mask;
  std::vector<int64_t> inverse_permutation;
  std::vector<uint32_t> sub_block_bits;  // for `mask`, or empty
  Tensor device_sub_block_bits;          // their copy on the device of a CUDA plan

  BlockMaskView view() const {
    BlockMaskView view = device_mask ? device_mask->view() : mask->view();
    if (!sub_block_bits.empty())
      view.sub_block_bits = device_mask ? device_sub_block_bits.data_as<const uint32_t>() : sub_block_bits.data();
    return view;
  }

  size_t workspace_bytes(const ExecContext& ctx) const override {
    if (permutation.empty()) return Metadata::workspace_bytes(ctx);
    return permuted_attention_workspace_bytes(ctx, shape, spec.block_kv, /*with_lse=*/true);
  }
};

BlockMaskView mask_view_for(const BlockMask& mask, const std::optional<BlockMask::DeviceCopy>& device_mask) {
  return device_mask ? device_mask->view() : mask.view();
}

// The kernels' sub-block bits as a tensor on `device` (words stored as int32).
Tensor bits_on_device(const std::vector<uint32_t>& bits, Device device) {
  Tensor host = Tensor::empty({static_cast<int64_t>(bits.size())}, DType::kI32);
  std::memcpy(host.data(), bits.data(), bits.size() * sizeof(uint32_t));
#ifdef TESSEL_WITH_CUDA
  return host.to(device);
#else
  fail_argument("device", "cpu (tessel was built without CUDA)", device.str());
#endif
}

[[noreturn]] void reject_sub_block_mask(const PatternSpec& spec, const Backend& backend) {
  fail_argument("pattern.sub_block_mask",
                "empty (backend '" + backend.name() + "' computes whole blocks; the block_sparse backend executes it)",
                std::to_string(spec.sub_block_mask.size()) + " entries");
}

class InfoBackend : public Backend, public std::enable_shared_from_this<InfoBackend> {
 public:
  explicit InfoBackend(PatternBackendInfo info) : info_(std::move(info)) {
    if (info_.name.empty()) fail_argument("PatternBackendInfo.name", "a non-empty name", "''");
    if (info_.patterns.empty()) fail_argument("PatternBackendInfo.patterns of '" + info_.name + "'", "at least one pattern", "none");
  }
  std::string name() const override { return info_.name; }
  std::vector<PatternType> supported_patterns() const override { return info_.patterns; }
  std::vector<ModuleType> supported_module_types() const override { return info_.modules; }
  std::vector<DeviceType> supported_devices() const override { return info_.devices; }
  int score() const override { return info_.score; }
  void validate_config(const ResolvedSparseAttnConfig& config) const override {
    if (info_.validate_config) info_.validate_config(config);
  }
  std::shared_ptr<const Backend> self() const { return shared_from_this(); }

 private:
  PatternBackendInfo info_;
};

// ---- static masks ---------------------------------------------------------------------------

// A metadata builder bound to one backend: every request is checked against the backend's declared
// support before build() sees it, and every plan carries the backend's name and the request.
class BackendMetadataBuilder : public MetadataBuilder {
 public:
  std::shared_ptr<Metadata> plan(const ExecContext& ctx, const PatternSpec& spec, ModuleType module,
                                 const AttentionShape& shape) final {
    check_plan_request(*backend_, spec, module, shape);
    std::shared_ptr<Metadata> metadata = build(ctx, spec, module, shape);
    metadata->set_request(backend_->name(), spec, module, shape);
    return metadata;
  }

 protected:
  explicit BackendMetadataBuilder(std::shared_ptr<const Backend> backend) : backend_(std::move(backend)) {}
  virtual std::shared_ptr<Metadata> build(const ExecContext& ctx, const PatternSpec& spec, ModuleType module,
                                          const AttentionShape& shape) = 0;
  std::shared_ptr<const Backend> backend_;
};

class PlanningBuilder : public BackendMetadataBuilder {
 public:
  PlanningBuilder(std::shared_ptr<const Backend> backend, MaskPlanner planner)
      : BackendMetadataBuilder(std::move(backend)), planner_(std::move(planner)) {}

 protected:
  std::shared_ptr<Metadata> build(const ExecContext&, const PatternSpec& spec, ModuleType module,
                                  const AttentionShape& shape) override {
    PlannedMask planned = planner_(spec, module, shape);
    auto metadata = std::make_shared<MaskMetadata>();
    BlockMask mask = apply_always_keep(spec, planned.mask);
    check_mask_geometry(mask, spec, shape, "backend '" + backend_->name() + "'");
    if (!planned.permutation.empty()) {
      check_permutation(planned.permutation, shape, "backend '" + backend_->name() + "' permutation");
      if (!shape.device.is_cpu())
        fail_argument("backend '" + backend_->name() + "' token permutation device", "cpu", shape.device.str());
      metadata->inverse_permutation = invert_permutation(planned.permutation);
      metadata->permutation = std::move(planned.permutation);
    }
    if (!spec.sub_block_mask.empty() && planned.sub_block_bits.empty()) reject_sub_block_mask(spec, *backend_);
    if (!planned.sub_block_bits.empty())
      metadata->sub_block_bits = extend_sub_block_bits(planned.mask, planned.sub_block_bits, mask);
    if (shape.device.is_cuda()) {
      metadata->device_mask = mask.to_device(shape.device);
      if (!metadata->sub_block_bits.empty()) metadata->device_sub_block_bits = bits_on_device(metadata->sub_block_bits, shape.device);
    }
    metadata->mask = std::make_shared<const BlockMask>(std::move(mask));
    return metadata;
  }

 private:
  MaskPlanner planner_;
};

class PlanningImpl : public Impl {
 public:
  ForwardStats forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                       const Metadata& metadata, const StepInfo&, const TensorView& out, const TensorView& lse) override {
    const auto* planned = dynamic_cast<const MaskMetadata*>(&metadata);
    if (planned == nullptr || !planned->mask)
      fail_argument("metadata", "a plan made by backend '" + metadata.backend + "'s metadata builder", "foreign metadata");
    check_forward_shape(metadata, q, k, v);
    const BlockMaskView view = planned->view();
    if (planned->permutation.empty()) {
      block_sparse_attention_forward(ctx, q, k, v, view, out, lse);
    } else {
      permuted_block_sparse_attention(ctx, q, k, v, view, planned->permutation, planned->inverse_permutation, out, lse);
    }
    return ForwardStats{planned->mask->density(), 0.0};
  }
};

class MaskPlanningBackend : public InfoBackend {
 public:
  MaskPlanningBackend(PatternBackendInfo info, MaskPlanner planner) : InfoBackend(std::move(info)), planner_(std::move(planner)) {
    if (!planner_) fail_argument("planner of '" + name() + "'", "a callable function", "an empty function");
  }
  std::unique_ptr<MetadataBuilder> make_metadata_builder() const override {
    return std::make_unique<PlanningBuilder>(self(), planner_);
  }
  std::unique_ptr<Impl> make_impl() const override { return std::make_unique<PlanningImpl>(); }

 private:
  MaskPlanner planner_;
};

// ---- data-dependent masks -------------------------------------------------------------------

// A CUDA plan of a backend with a device estimator: the device mask and its statistics.
struct DeviceEstimateMetadata : Metadata {
#ifdef TESSEL_WITH_CUDA
  std::shared_ptr<detail::DeviceEstimateState> state;
#endif
};

class EstimatingBuilder : public BackendMetadataBuilder {
 public:
  EstimatingBuilder(std::shared_ptr<const Backend> backend, DeviceMaskEstimator device_estimator)
      : BackendMetadataBuilder(std::move(backend)), device_estimator_(std::move(device_estimator)) {}
 protected:
  std::shared_ptr<Metadata> build(const ExecContext&, const PatternSpec& spec, ModuleType,
                                  const AttentionShape& shape) override {
    if (!spec.sub_block_mask.empty()) reject_sub_block_mask(spec, *backend_);
    std::shared_ptr<Metadata> metadata = std::make_shared<Metadata>();
    if (shape.device.is_cuda() && device_estimator_.estimate) {
      if (device_estimator_.check) device_estimator_.check(spec, shape);
      auto device = std::make_shared<DeviceEstimateMetadata>();
#ifdef TESSEL_WITH_CUDA
      device->state = std::make_shared<detail::DeviceEstimateState>(shape, spec);
#endif
      metadata = std::move(device);
    }
    return metadata;
  }

 private:
  DeviceMaskEstimator device_estimator_;
};

class EstimatingImpl : public Impl {
 public:
  EstimatingImpl(std::string name, MaskEstimator estimator, DeviceMaskEstimator device_estimator)
      : name_(std::move(name)), estimator_(std::move(estimator)), device_estimator_(std::move(device_estimator)) {}

  ForwardStats forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                       const Metadata& metadata, const StepInfo& step, const TensorView& out,
                       const TensorView& lse) override {
    check_forward_shape(metadata, q, k, v);
    if (const auto* device = dynamic_cast<const DeviceEstimateMetadata*>(&metadata))
      return forward_device(ctx, q, k, v, *device, step, out, lse);
    const auto start = std::chrono::steady_clock::now();
    BlockMask mask = apply_always_keep(metadata.spec, estimator_(ctx, q, k, metadata.spec, step, metadata.shape));
    check_mask_geometry(mask, metadata.spec, metadata.shape, "estimator of backend '" + name_ + "'");
    std::optional<BlockMask::DeviceCopy> device_mask;
    if (q.device().is_cuda()) device_mask = mask.to_device(q.device());
    const double estimate_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    block_sparse_attention_forward(ctx, q, k, v, mask_view_for(mask, device_mask), out, lse);
    return ForwardStats{mask.density(), estimate_ms};
  }

  // The mask forward() would attend with: the host estimator's for CPU tensors; for CUDA tensors
  // the device estimator's, estimated in stream order into the plan's device mask and copied to the
  // host (this synchronizes with ctx.stream: callers that cut the mask per rank need it there).
  std::optional<BlockMask> executed_mask(const ExecContext& ctx, const TensorView& q, const TensorView& k,
                                         const Metadata& metadata, const StepInfo& step) override {
    if (!q.device().is_cpu()) {
#ifdef TESSEL_WITH_CUDA
      const auto* device = dynamic_cast<const DeviceEstimateMetadata*>(&metadata);
      if (device == nullptr) return std::nullopt;
      check_forward_shape(metadata, q, k, k);
      DeviceEstimatedMask& mask = device->state->mask();
      device_estimator_.estimate(ctx, q, k, metadata.spec, step, mask);
      const cudaError_t status = cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(ctx.stream));
      if (status != cudaSuccess) throw Error(detail::concat("estimator of backend '", name_, "': ", cudaGetErrorString(status)));
      BlockMask host = mask.to_host();
      check_mask_geometry(host, metadata.spec, metadata.shape, "device estimator of backend '" + name_ + "'");
      return host;
#else
      return std::nullopt;
#endif
    }
    BlockMask mask = apply_always_keep(metadata.spec, estimator_(ctx, q, k, metadata.spec, step, metadata.shape));
    check_mask_geometry(mask, metadata.spec, metadata.shape, "estimator of backend '" + name_ + "'");
    return mask;
  }

  std::optional<DeviceMaskEstimate> estimate_on_device(const ExecContext& ctx, const TensorView& q, const TensorView& k,
                                                       const Metadata& metadata, const StepInfo& step) override {
#ifdef TESSEL_WITH_CUDA
    const auto* device = dynamic_cast<const DeviceEstimateMetadata*>(&metadata);
    if (device == nullptr) return std::nullopt;
    check_forward_shape(metadata, q, k, k);
    detail::DeviceEstimateState& state = *device->state;
    const std::optional<ForwardStats> measured = state.finished(ctx.stream);
    state.begin(ctx.stream);
    device_estimator_.estimate(ctx, q, k, metadata.spec, step, state.mask());
    state.end(ctx.stream);
    return DeviceMaskEstimate{state.mask().view(), measured.value_or(ForwardStats{metadata.planned_density(), 0.0})};
#else
    (void)ctx, (void)q, (void)k, (void)metadata, (void)step;
    return std::nullopt;
#endif
  }

 private:
  // Estimate into the plan's device mask and attend with it, all in stream order (no host sync).
  ForwardStats forward_device(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                              const DeviceEstimateMetadata& metadata, const StepInfo& step, const TensorView& out,
                              const TensorView& lse) {
#ifdef TESSEL_WITH_CUDA
    detail::DeviceEstimateState& state = *metadata.state;
    const std::optional<ForwardStats> measured = state.finished(ctx.stream);
    state.begin(ctx.stream);
    device_estimator_.estimate(ctx, q, k, metadata.spec, step, state.mask());
    state.end(ctx.stream);
    block_sparse_attention_forward(ctx, q, k, v, state.mask().view(), out, lse);
    return measured.value_or(ForwardStats{metadata.planned_density(), 0.0});
#else
    (void)ctx, (void)q, (void)k, (void)v, (void)step, (void)out, (void)lse;
    fail_argument("backend '" + name_ + "' device", "cpu (tessel was built without CUDA)", metadata.shape.device.str());
#endif
  }

  std::string name_;
  MaskEstimator estimator_;
  DeviceMaskEstimator device_estimator_;
};

class MaskEstimatingBackend : public InfoBackend {
 public:
  MaskEstimatingBackend(PatternBackendInfo info, MaskEstimator estimator, DeviceMaskEstimator device_estimator)
      : InfoBackend(std::move(info)), estimator_(std::move(estimator)), device_estimator_(std::move(device_estimator)) {
    if (!estimator_) fail_argument("estimator of '" + name() + "'", "a callable function", "an empty function");
  }
  std::unique_ptr<MetadataBuilder> make_metadata_builder() const override {
    return std::make_unique<EstimatingBuilder>(self(), device_estimator_);
  }
  std::unique_ptr<Impl> make_impl() const override {
    return std::make_unique<EstimatingImpl>(name(), estimator_, device_estimator_);
  }

 private:
  MaskEstimator estimator_;
  DeviceMaskEstimator device_estimator_;
};

// Sorted union of two sorted, unique lists.
void merge_into(std::vector<int32_t>& row, const std::vector<int32_t>& extra) {
  if (extra.empty()) return;
  std::vector<int32_t> merged;
  merged.reserve(row.size() + extra.size());
  std::set_union(row.begin(), row.end(), extra.begin(), extra.end(), std::back_inserter(merged));
  row.swap(merged);
}

std::vector<int32_t> block_range(int64_t first, int64_t last) {
  std::vector<int32_t> out;
  for (int64_t b = first; b <= last; ++b) out.push_back(static_cast<int32_t>(b));
  return out;
}

// Blocks of `block`-token blocks over `seq` tokens that hold text tokens, as [first, last].
BlockRange text_blocks(int64_t text_tokens, bool text_first, int64_t seq, int64_t block) {
  const int64_t count = std::min(text_tokens, seq);
  if (count <= 0) return {};
  const int64_t lo = text_first ? 0 : seq - count;
  const int64_t hi = text_first ? count - 1 : seq - 1;
  return {lo / block, hi / block};
}

}  // namespace

std::vector<DeviceType> PatternBackendInfo::default_devices() {
  std::vector<DeviceType> devices = {DeviceType::kCPU};
  if (cuda_compiled()) devices.push_back(DeviceType::kCUDA);
  return devices;
}

std::shared_ptr<Backend> make_mask_planning_backend(PatternBackendInfo info, MaskPlanner planner) {
  return std::make_shared<MaskPlanningBackend>(std::move(info), std::move(planner));
}

std::shared_ptr<Backend> make_mask_estimating_backend(PatternBackendInfo info, MaskEstimator estimator) {
  return std::make_shared<MaskEstimatingBackend>(std::move(info), std::move(estimator), DeviceMaskEstimator{});
}

std::shared_ptr<Backend> make_mask_estimating_backend(PatternBackendInfo info, MaskEstimator estimator,
                                                      DeviceMaskEstimator device_estimator) {
  if (!device_estimator.estimate)
    fail_argument("device estimator of '" + info.name + "'", "a callable estimate function", "an empty function");
  return std::make_shared<MaskEstimatingBackend>(std::move(info), std::move(estimator), std::move(device_estimator));
}

BlockMask device_estimated_mask(const Metadata& metadata) {
  const auto* device = dynamic_cast<const DeviceEstimateMetadata*>(&metadata);
  if (device == nullptr)
    fail_argument("metadata", "a CUDA plan of a device-estimating backend",
                  "a plan of backend '" + metadata.backend + "' on " + metadata.shape.device.str());
#ifdef TESSEL_WITH_CUDA
  return device->state->mask().to_host();
#else
  fail_argument("metadata", "a CUDA plan (tessel was built without CUDA)", metadata.shape.device.str());
#endif
}

BlockRange diagonal_kv_blocks(const BlockMaskShape& shape, int64_t q_block) {
  const int64_t shift = shape.seq_kv - shape.seq_q;
  const int64_t lo = q_block * shape.block_q + shift;
  const int64_t hi = std::min((q_block + 1) * shape.block_q, shape.seq_q) - 1 + shift;
  if (hi < 0 || lo > shape.seq_kv - 1) return {};
  return {std::max<int64_t>(lo, 0) / shape.block_kv, std::min(hi, shape.seq_kv - 1) / shape.block_kv};
}

BlockMask apply_always_keep(const PatternSpec& spec, const BlockMask& mask) {
  const bool text = spec.keep_text && spec.num_text_tokens.value_or(0) > 0;
  if (!spec.keep_diagonal && spec.sink_blocks <= 0 && !text) return mask;
  const BlockMaskShape& shape = mask.shape();
  const int64_t q_blocks = shape.q_blocks();
  const int64_t kv_blocks = shape.kv_blocks();
  const std::vector<int32_t> sinks = block_range(0, std::min(spec.sink_blocks, kv_blocks) - 1);
  BlockRange q_text, kv_text;
  if (text) {
    q_text = text_blocks(*spec.num_text_tokens, spec.text_first, shape.seq_q, shape.block_q);
    kv_text = text_blocks(*spec.num_text_tokens, spec.text_first, shape.seq_kv, shape.block_kv);
  }
  const std::vector<int32_t> text_columns = block_range(kv_text.first, kv_text.last);
  const std::vector<int32_t> all_columns = block_range(0, kv_blocks - 1);

  std::vector<std::vector<int32_t>> rows;
  rows.reserve(static_cast<size_t>(shape.num_rows()));
  for (int64_t b = 0; b < shape.mask_batch; ++b) {
    for (int64_t h = 0; h < shape.mask_heads; ++h) {
      for (int64_t qb = 0; qb < q_blocks; ++qb) {
        std::vector<int32_t> row = mask.row(b, h, qb);
        if (text && qb >= q_text.first && qb <= q_text.last) {
          row = all_columns;
        } else {
          if (spec.keep_diagonal) {
            const BlockRange diagonal = diagonal_kv_blocks(shape, qb);
            merge_into(row, block_range(diagonal.first, diagonal.last));
          }
          merge_into(row, sinks);
          merge_into(row, text_columns);
        }
        rows.push_back(std::move(row));
      }
    }
  }
  return BlockMask::from_rows(shape, rows);
}

void check_mask_geometry(const BlockMask& mask, const PatternSpec& spec, const AttentionShape& shape,
                         const std::string& who) {
  const BlockMaskShape& s = mask.shape();
  if (s.block_q != spec.block_q || s.block_kv != spec.block_kv)
    fail_argument(who + " mask block sizes", std::to_string(spec.block_q) + "x" + std::to_string(spec.block_kv),
                  std::to_string(s.block_q) + "x" + std::to_string(s.block_kv));
  if (s.seq_q != shape.seq_q || s.seq_kv != shape.seq_kv)
    fail_argument(who + " mask sequence lengths", std::to_string(shape.seq_q) + "x" + std::to_string(shape.seq_kv),
                  std::to_string(s.seq_q) + "x" + std::to_string(s.seq_kv));
  if (s.mask_batch != 1 && s.mask_batch != shape.batch)
    fail_argument(who + " mask_batch", "1 or " + std::to_string(shape.batch), s.mask_batch);
  if (s.mask_heads != 1 && s.mask_heads != shape.num_kv_heads && s.mask_heads != shape.num_qo_heads)
    fail_argument(who + " mask_heads",
                  "1, " + std::to_string(shape.num_kv_heads) + " or " + std::to_string(shape.num_qo_heads), s.mask_heads);
}

}  // namespace tessel
