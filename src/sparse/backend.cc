#include "tessel/sparse/backend.h"

#include <algorithm>
#include <array>
#include <utility>

#include "enum_names.h"
#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"

namespace tessel {
namespace {

constexpr std::array<std::string_view, kNumModuleTypes> kModuleNames = {"dit_self", "dit_cross", "dit_joint",
                                                                         "llm_prefill", "llm_decode"};

void check_positive(const std::string& field, int64_t value) {
  if (value < 1) fail_argument(field, ">= 1", value);
}

}  // namespace

std::string_view module_type_name(ModuleType type) { return detail::name_of(kModuleNames, type); }
ModuleType parse_module_type(std::string_view name) {
  return detail::parse_name<ModuleType>(kModuleNames, name, "module_type");
}

const std::vector<ModuleType>& all_module_types() {
  static const std::vector<ModuleType> types = detail::all_values<ModuleType>(kModuleNames);
  return types;
}

std::string_view device_type_name(DeviceType type) { return type == DeviceType::kCPU ? "cpu" : "cuda"; }

void AttentionShape::validate() const {
  check_positive("shape.batch", batch);
  check_positive("shape.num_qo_heads", num_qo_heads);
  check_positive("shape.num_kv_heads", num_kv_heads);
  check_positive("shape.head_dim", head_dim);
  check_positive("shape.seq_q", seq_q);
  check_positive("shape.seq_kv", seq_kv);
  if (num_qo_heads % num_kv_heads != 0)
    fail_argument("shape.num_qo_heads", "a multiple of num_kv_heads (" + std::to_string(num_kv_heads) + ")",
                  num_qo_heads);
}

AttentionShape AttentionShape::of(const TensorView& q, const TensorView& k, const TensorView& v) {
  check_rank(q, 4, "q");
  check_rank(k, 4, "k");
  check_rank(v, 4, "v");
  check_dtype(k, q.dtype(), "k");
  check_dtype(v, q.dtype(), "v");
  check_device(k, q.device(), "k");
  check_device(v, q.device(), "v");
  check_shape(v, k.shape(), "v");
  if (k.size(0) != q.size(0)) fail_argument("k batch", q.size(0), k.size(0));
  if (k.size(3) != q.size(3)) fail_argument("k head_dim", q.size(3), k.size(3));
  const AttentionShape shape{.batch = q.size(0), .num_qo_heads = q.size(2), .num_kv_heads = k.size(2),
                             .head_dim = q.size(3), .seq_q = q.size(1), .seq_kv = k.size(1), .dtype = q.dtype(),
                             .device = q.device()};
  shape.validate();
  return shape;
}

std::string AttentionShape::str() const {
  return detail::concat("B=", batch, " Sq=", seq_q, " Skv=", seq_kv, " Hq=", num_qo_heads, " Hkv=", num_kv_heads,
                        " D=", head_dim, " ", dtype_name(dtype), " ", device.str());
}

Metadata::~Metadata() = default;

void Metadata::set_request(std::string backend_name, const PatternSpec& planned_spec, ModuleType planned_module,
                           const AttentionShape& planned_shape) {
  backend = std::move(backend_name);
  spec = planned_spec;
  module = planned_module;
  shape = planned_shape;
}

double Metadata::planned_density() const {
  if (mask) return mask->density();
  if (spec.type == PatternType::kDense) return 1.0;
  if (spec.type == PatternType::kThreshold) return 1.0;
  return spec.topk_ratio.value_or(1.0);
}

size_t Metadata::workspace_bytes(const ExecContext& ctx) const {
  const AttentionDims dims{shape.batch, shape.seq_q, shape.seq_kv, shape.num_qo_heads, shape.num_kv_heads, shape.head_dim};
  return attention_workspace_bytes(ctx, shape.device, dims, spec.type == PatternType::kDense ? 0 : spec.block_kv);
}

MetadataBuilder::~MetadataBuilder() = default;

std::shared_ptr<Metadata> MetadataBuilder::plan(const ExecContext& ctx, const PatternSpec& spec, ModuleType module,
                                                int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim,
                                                int64_t seq_q, int64_t seq_kv, int64_t batch, DType dtype,
                                                Device device) {
  const AttentionShape shape{.batch = batch, .num_qo_heads = num_qo_heads, .num_kv_heads = num_kv_heads,
                             .head_dim = head_dim, .seq_q = seq_q, .seq_kv = seq_kv, .dtype = dtype, .device = device};
  return plan(ctx, spec, module, shape);
}

Impl::~Impl() = default;

std::optional<BlockMask> Impl::executed_mask(const ExecContext&, const TensorView&, const TensorView&, const Metadata&,
                                             const StepInfo&) {
  return std::nullopt;
}
std::optional<DeviceMaskEstimate> Impl::estimate_on_device(const ExecContext&, const TensorView&, const TensorView&,
                                                           const Metadata&, const StepInfo&) {
  return std::nullopt;
}
Backend::~Backend() = default;

void Backend::validate_config(const ResolvedSparseAttnConfig&) const {}

bool Backend::supports(PatternType pattern) const {
  const auto patterns = supported_patterns();
  return std::find(patterns.begin(), patterns.end(), pattern) != patterns.end();
}
bool Backend::supports(ModuleType module) const {
  const auto modules = supported_module_types();
  return std::find(modules.begin(), modules.end(), module) != modules.end();
}
bool Backend::supports(DeviceType device) const {
  const auto devices = supported_devices();
  return std::find(devices.begin(), devices.end(), device) != devices.end();
}

}  // namespace tessel

namespace tessel {
namespace {

template <typename T, typename NameFn>
std::string join(const std::vector<T>& items, NameFn name) {
  std::string out;
  for (const T& item : items) out += (out.empty() ? "" : ", ") + std::string(name(item));
  return out.empty() ? "nothing" : out;
}

}  // namespace

void check_plan_request(const Backend& backend, const PatternSpec& spec, ModuleType module, const AttentionShape& shape) {
  shape.validate();
  spec.validate();
  const std::string who = "backend '" + backend.name() + "'";
  if (!backend.supports(spec.type))
    fail_argument(who + " pattern_type", "one of " + join(backend.supported_patterns(), pattern_type_name),
                  pattern_type_name(spec.type));
  if (!backend.supports(module))
    fail_argument(who + " module type", "one of " + join(backend.supported_module_types(), module_type_name),
                  module_type_name(module));
  if (!backend.supports(shape.device.type))
    fail_argument(who + " device", "one of " + join(backend.supported_devices(), device_type_name), shape.device.str());
}

void check_forward_shape(const Metadata& metadata, const TensorView& q, const TensorView& k, const TensorView& v) {
  const AttentionShape actual = AttentionShape::of(q, k, v);
  if (!(actual == metadata.shape))
    fail_argument("q/k/v of backend '" + metadata.backend + "'", "the planned shape " + metadata.shape.str(),
                  actual.str());
}

}  // namespace tessel
