#include "plugin_abi.h"

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

#include "tessel/core/error.h"
#include "tessel/core/log.h"
#include "tessel/sparse/block_mask.h"

namespace tessel::plugin {
namespace {

// The C enums promise tessel's numbering; the casts below rely on it.
static_assert(TESSEL_DTYPE_F32 == static_cast<int>(DType::kF32) && TESSEL_DTYPE_F16 == static_cast<int>(DType::kF16) &&
              TESSEL_DTYPE_BF16 == static_cast<int>(DType::kBF16) && TESSEL_DTYPE_F64 == static_cast<int>(DType::kF64) &&
              TESSEL_DTYPE_I32 == static_cast<int>(DType::kI32) && TESSEL_DTYPE_U8 == static_cast<int>(DType::kU8));
static_assert(TESSEL_DEVICE_CPU == static_cast<int>(DeviceType::kCPU) &&
              TESSEL_DEVICE_CUDA == static_cast<int>(DeviceType::kCUDA));
static_assert(TESSEL_PATTERN_DENSE == static_cast<int>(PatternType::kDense) &&
              TESSEL_PATTERN_BLOCK_SPARSE == static_cast<int>(PatternType::kBlockSparse) &&
              TESSEL_PATTERN_SLIDING_WINDOW == static_cast<int>(PatternType::kSlidingWindow) &&
              TESSEL_PATTERN_SPATIAL_AWARE == static_cast<int>(PatternType::kSpatialAware) &&
              TESSEL_PATTERN_DYNAMIC_TOPK == static_cast<int>(PatternType::kDynamicTopk) &&
              TESSEL_PATTERN_THRESHOLD == static_cast<int>(PatternType::kThreshold) &&
              TESSEL_PATTERN_RADIAL == static_cast<int>(PatternType::kRadial) &&
              TESSEL_PATTERN_LOCAL == static_cast<int>(PatternType::kLocal) &&
              TESSEL_PATTERN_ARROW == static_cast<int>(PatternType::kArrow) &&
              TESSEL_PATTERN_COMPOSITE == static_cast<int>(PatternType::kComposite) &&
              TESSEL_PATTERN_HEAD_CLASSIFY == static_cast<int>(PatternType::kHeadClassify) && kNumPatternTypes == 11);
static_assert(TESSEL_MODULE_DIT_SELF == static_cast<int>(ModuleType::kDitSelf) &&
              TESSEL_MODULE_DIT_CROSS == static_cast<int>(ModuleType::kDitCross) &&
              TESSEL_MODULE_DIT_JOINT == static_cast<int>(ModuleType::kDitJoint) &&
              TESSEL_MODULE_LLM_PREFILL == static_cast<int>(ModuleType::kLlmPrefill) &&
              TESSEL_MODULE_LLM_DECODE == static_cast<int>(ModuleType::kLlmDecode) && kNumModuleTypes == 5);
static_assert(static_cast<int>(SpatialOrdering::kRaster) == 0 && static_cast<int>(SpatialOrdering::kHilbert) == 1 &&
              static_cast<int>(SpatialOrdering::kZCurve) == 2);
static_assert(TESSEL_LOG_DEBUG == static_cast<int>(LogLevel::kDebug) && TESSEL_LOG_ERROR == static_cast<int>(LogLevel::kError));

constexpr double kAbsentReal = std::numeric_limits<double>::quiet_NaN();

void set_message(tessel_error* error, const char* message) {
  if (error == nullptr) return;
  std::strncpy(error->message, message, TESSEL_ERROR_MESSAGE_SIZE - 1);
  error->message[TESSEL_ERROR_MESSAGE_SIZE - 1] = '\0';
}

// Runs `body`, turning any exception into a status and message: nothing may unwind into C.
template <typename Body>
tessel_status guarded(tessel_error* error, Body&& body) {
  try {
    body();
    return TESSEL_OK;
  } catch (const Error& e) {
    set_message(error, e.what());
    return TESSEL_ERROR_INVALID_ARGUMENT;
  } catch (const std::bad_alloc&) {
    set_message(error, "out of memory");
    return TESSEL_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_message(error, e.what());
    return TESSEL_ERROR_INTERNAL;
  } catch (...) {
    set_message(error, "unknown exception in the tessel host");
    return TESSEL_ERROR_INTERNAL;
  }
}

TensorView optional_tensor(const tessel_tensor* tensor, const std::string& argument) {
  return tensor == nullptr ? TensorView{} : from_c(*tensor, argument);
}

void host_log(int32_t level, const char* message) {
  const LogLevel clamped = level <= 0 ? LogLevel::kDebug : level >= 3 ? LogLevel::kError : static_cast<LogLevel>(level);
  log_message(clamped, std::string("plugin: ") + (message ? message : ""));
}

tessel_status host_attention_with_context(const tessel_exec_context* c_ctx, const tessel_tensor* q,
                                         const tessel_tensor* k, const tessel_tensor* v, const tessel_tensor* out,
                                         const tessel_tensor* lse, const tessel_attention_options* options,
                                         tessel_error* error) {
  return guarded(error, [&] {
    if (!q || !k || !v || !out) throw Error("attention: q, k, v and out must not be NULL");
    Workspace workspace;
    const ExecContext ctx = from_c(c_ctx, workspace);
    attention_forward(ctx, from_c(*q, "q"), from_c(*k, "k"), from_c(*v, "v"), from_c(*out, "out"),
                      optional_tensor(lse, "lse"), from_c(options));
  });
}

tessel_status host_attention(const tessel_tensor* q, const tessel_tensor* k, const tessel_tensor* v,
                             const tessel_tensor* out, const tessel_tensor* lse,
                             const tessel_attention_options* options, tessel_error* error) {
  return host_attention_with_context(nullptr, q, k, v, out, lse, options, error);
}

// Copies and validates a plugin's host mask (the kernels trust the masks they are given).
BlockMask copy_host_mask(const tessel_block_mask& mask) {
  if (mask.device_type != TESSEL_DEVICE_CPU) throw Error("mask: expected CPU arrays, got device arrays");
  if (mask.indptr == nullptr) throw Error("mask.indptr: expected an array, got NULL");
  const BlockMaskShape shape{mask.mask_batch, mask.mask_heads, mask.seq_q, mask.seq_kv, mask.block_q, mask.block_kv};
  if (shape.block_q < 1 || shape.block_kv < 1 || shape.mask_batch < 1 || shape.mask_heads < 1)
    fail_argument("mask block sizes and broadcast dims", ">= 1", "a value < 1");
  if (shape.q_blocks() != mask.q_blocks || shape.kv_blocks() != mask.kv_blocks)
    fail_argument("mask.q_blocks/kv_blocks", std::to_string(shape.q_blocks()) + "/" + std::to_string(shape.kv_blocks()),
                  std::to_string(mask.q_blocks) + "/" + std::to_string(mask.kv_blocks));
  std::vector<int32_t> indptr(mask.indptr, mask.indptr + shape.num_rows() + 1);
  const int64_t nnz = std::max<int64_t>(indptr.back(), 0);
  if (nnz > 0 && mask.indices == nullptr) throw Error("mask.indices: expected an array, got NULL");
  std::vector<int32_t> indices(mask.indices, mask.indices + nnz);
  return BlockMask::from_csr(shape, std::move(indptr), std::move(indices));
}

tessel_status host_block_sparse_attention_with_context(const tessel_exec_context* c_ctx, const tessel_tensor* q,
                                                       const tessel_tensor* k, const tessel_tensor* v,
                                                       const tessel_block_mask* mask, const tessel_tensor* out,
                                                       const tessel_tensor* lse,
                                                       const tessel_attention_options* options, tessel_error* error) {
  return guarded(error, [&] {
    if (!q || !k || !v || !out || !mask) throw Error("block_sparse_attention: q, k, v, mask and out must not be NULL");
    Workspace workspace;
    const ExecContext ctx = from_c(c_ctx, workspace);
    const TensorView qv = from_c(*q, "q");
    const auto run = [&](const BlockMaskView& view) {
      block_sparse_attention_forward(ctx, qv, from_c(*k, "k"), from_c(*v, "v"), view, from_c(*out, "out"),
                                     optional_tensor(lse, "lse"), from_c(options));
    };
    if (mask->device_type != TESSEL_DEVICE_CPU) {
      run(from_c(*mask));  // device arrays: the plugin owns and validated them
      return;
    }
    const BlockMask owned = copy_host_mask(*mask);
    if (qv.device().is_cuda()) {
      const BlockMask::DeviceCopy copy = owned.to_device(qv.device());
      run(copy.view());
    } else {
      run(owned.view());
    }
  });
}

tessel_status host_block_sparse_attention(const tessel_tensor* q, const tessel_tensor* k, const tessel_tensor* v,
                                          const tessel_block_mask* mask, const tessel_tensor* out,
                                          const tessel_tensor* lse, const tessel_attention_options* options,
                                          tessel_error* error) {
  return host_block_sparse_attention_with_context(nullptr, q, k, v, mask, out, lse, options, error);
}

tessel_status host_validate_block_mask(const tessel_block_mask* mask, tessel_error* error) {
  return guarded(error, [&] {
    if (mask == nullptr) throw Error("mask: expected a block mask, got NULL");
    copy_host_mask(*mask);
  });
}

}  // namespace

tessel_tensor to_c(const TensorView& view) {
  tessel_tensor tensor{};
  if (view.dim() > TESSEL_MAX_DIMS) fail_argument("tensor rank", "<= " + std::to_string(TESSEL_MAX_DIMS), view.dim());
  tensor.data = view.data();
  tensor.dtype = static_cast<int32_t>(view.dtype());
  tensor.device_type = static_cast<int32_t>(view.device().type);
  tensor.device_index = view.device().index;
  tensor.ndim = static_cast<int32_t>(view.dim());
  for (int64_t d = 0; d < view.dim(); ++d) {
    tensor.shape[d] = view.size(d);
    tensor.strides[d] = view.stride(d);
  }
  return tensor;
}

TensorView from_c(const tessel_tensor& tensor, const std::string& argument) {
  if (tensor.ndim < 0 || tensor.ndim > TESSEL_MAX_DIMS)
    fail_argument(argument + ".ndim", "0.." + std::to_string(TESSEL_MAX_DIMS), tensor.ndim);
  if (tensor.dtype < TESSEL_DTYPE_F32 || tensor.dtype > TESSEL_DTYPE_U8) fail_argument(argument + ".dtype", "0..5", tensor.dtype);
  if (tensor.device_type != TESSEL_DEVICE_CPU && tensor.device_type != TESSEL_DEVICE_CUDA)
    fail_argument(argument + ".device_type", "0 (cpu) or 1 (cuda)", tensor.device_type);
  Shape shape(tensor.shape, tensor.shape + tensor.ndim);
  Shape strides(tensor.strides, tensor.strides + tensor.ndim);
  if (tensor.data == nullptr && shape_numel(shape) > 0) fail_argument(argument + ".data", "a pointer", "NULL");
  const Device device{static_cast<DeviceType>(tensor.device_type), tensor.device_index};
  return TensorView(tensor.data, static_cast<DType>(tensor.dtype), device, std::move(shape), std::move(strides));
}

tessel_block_mask to_c(const BlockMaskView& mask) {
  tessel_block_mask out{};
  out.indptr = mask.indptr;
  out.indices = mask.indices;
  out.mask_batch = mask.mask_batch;
  out.mask_heads = mask.mask_heads;
  out.q_blocks = mask.q_blocks;
  out.kv_blocks = mask.kv_blocks;
  out.block_q = mask.block_q;
  out.block_kv = mask.block_kv;
  out.seq_q = mask.seq_q;
  out.seq_kv = mask.seq_kv;
  out.device_type = static_cast<int32_t>(mask.device.type);
  out.device_index = mask.device.index;
  return out;
}

BlockMaskView from_c(const tessel_block_mask& mask) {
  if (mask.device_type != TESSEL_DEVICE_CPU && mask.device_type != TESSEL_DEVICE_CUDA)
    fail_argument("mask.device_type", "0 (cpu) or 1 (cuda)", mask.device_type);
  BlockMaskView view;
  view.indptr = mask.indptr;
  view.indices = mask.indices;
  view.mask_batch = mask.mask_batch;
  view.mask_heads = mask.mask_heads;
  view.q_blocks = mask.q_blocks;
  view.kv_blocks = mask.kv_blocks;
  view.block_q = mask.block_q;
  view.block_kv = mask.block_kv;
  view.seq_q = mask.seq_q;
  view.seq_kv = mask.seq_kv;
  view.device = Device{static_cast<DeviceType>(mask.device_type), mask.device_index};
  return view;
}

tessel_attention_options to_c(const AttentionOptions& options) {
  return tessel_attention_options{options.scale, options.causal ? 1 : 0, options.window_left, options.window_right};
}

AttentionOptions from_c(const tessel_attention_options* options) {
  AttentionOptions out;
  if (options == nullptr) return out;
  out.scale = options->scale;
  out.causal = options->causal != 0;
  out.window_left = options->window_left;
  out.window_right = options->window_right;
  return out;
}

tessel_plan_request to_c(const AttentionShape& shape, ModuleType module) {
  tessel_plan_request request{};
  request.module_type = static_cast<int32_t>(module);
  request.batch = shape.batch;
  request.num_qo_heads = shape.num_qo_heads;
  request.num_kv_heads = shape.num_kv_heads;
  request.head_dim = shape.head_dim;
  request.seq_q = shape.seq_q;
  request.seq_kv = shape.seq_kv;
  request.dtype = static_cast<int32_t>(shape.dtype);
  request.device_type = static_cast<int32_t>(shape.device.type);
  request.device_index = shape.device.index;
  return request;
}

tessel_exec_context to_c(const ExecContext& ctx, const StepInfo& step) {
  tessel_exec_context c{};
  c.struct_size = static_cast<uint32_t>(sizeof(tessel_exec_context));
  c.device_type = static_cast<int32_t>(ctx.device.type);
  c.device_index = ctx.device.index;
  c.num_threads = ctx.num_threads;
  c.stream = ctx.stream;
  if (ctx.workspace != nullptr) {
    c.workspace = ctx.workspace->data();
    c.workspace_bytes = ctx.workspace->capacity();
  }
  c.step = step.step.value_or(-1);
  c.total_steps = step.total_steps;
  c.layer = step.layer;
  c.cfg_branch = step.cfg_branch;
  c.density = step.density.value_or(kAbsentReal);
  return c;
}

ExecContext from_c(const tessel_exec_context* c, Workspace& workspace) {
  ExecContext ctx;
  if (c == nullptr) return ctx;
  // The host reads the stream, threads and workspace: the struct must reach that far.
  constexpr size_t kNeeded = offsetof(tessel_exec_context, workspace_bytes) + sizeof(uint64_t);
  if (c->struct_size < kNeeded) fail_argument("ctx.struct_size", detail::concat(">= ", kNeeded, " bytes"), c->struct_size);
  if (c->device_type != TESSEL_DEVICE_CPU && c->device_type != TESSEL_DEVICE_CUDA)
    fail_argument("ctx.device_type", "0 (cpu) or 1 (cuda)", c->device_type);
  ctx.device = Device{static_cast<DeviceType>(c->device_type), c->device_index};
  ctx.num_threads = c->num_threads;
  ctx.stream = static_cast<StreamHandle>(c->stream);
  if (c->workspace != nullptr) {
    workspace = Workspace::borrowed(c->workspace, static_cast<size_t>(c->workspace_bytes), ctx.device);
    ctx.workspace = &workspace;
  }
  return ctx;
}

CPatternSpec::CPatternSpec(const PatternSpec& spec) {
  spec_.type = static_cast<int32_t>(spec.type);
  spec_.block_q = spec.block_q;
  spec_.block_kv = spec.block_kv;
  if (spec.block_mask) {
    mask_ = to_c(spec.block_mask->view());
    spec_.block_mask = &mask_;
  }
  spec_.sub_block_mask = spec.sub_block_mask.empty() ? nullptr : spec.sub_block_mask.data();
  spec_.window_size = spec.window_size.value_or(-1);
  spec_.has_spatial_layout = spec.spatial_layout.has_value() ? 1 : 0;
  if (spec.spatial_layout) {
    const SpatialLayout& l = *spec.spatial_layout;
    spec_.spatial_layout = tessel_spatial_layout{l.frames, l.height, l.width, l.patch_size, static_cast<int32_t>(l.ordering)};
  }
  spec_.spatial_radius = spec.spatial_radius.value_or(-1);
  spec_.decay_factor = spec.decay_factor;
  spec_.local_window_frames = spec.local_window_frames.value_or(-1);
  spec_.topk_ratio = spec.topk_ratio.value_or(kAbsentReal);
  spec_.threshold = spec.threshold.value_or(kAbsentReal);
  spec_.stride = spec.stride.value_or(-1);
  spec_.num_image_tokens = spec.num_image_tokens.value_or(-1);
  spec_.num_text_tokens = spec.num_text_tokens.value_or(-1);
  spec_.text_first = spec.text_first ? 1 : 0;
  spec_.cross_dense = spec.cross_dense ? 1 : 0;
  if (spec.i2i_pattern) {
    inner_ = std::make_unique<CPatternSpec>(*spec.i2i_pattern);
    spec_.i2i_pattern = inner_->get();
  }
  for (const PatternSpec& child : spec.children) {
    child_holders_.push_back(std::make_unique<CPatternSpec>(child));
    children_.push_back(*child_holders_.back()->get());
  }
  spec_.children = children_.empty() ? nullptr : children_.data();
  spec_.num_children = static_cast<int32_t>(children_.size());
  spec_.composite_op = spec.composite_op == CompositeOp::kIntersection ? 1 : 0;
  spec_.keep_diagonal = spec.keep_diagonal ? 1 : 0;
  spec_.sink_blocks = spec.sink_blocks;
  spec_.keep_text = spec.keep_text ? 1 : 0;
  spec_.current_step = spec.current_step.value_or(-1);
  spec_.total_steps = spec.total_steps.value_or(-1);
  for (const auto& [key, value] : spec.options) {
    keys_.push_back(key.c_str());
    values_.push_back(value.c_str());
  }
  spec_.option_keys = keys_.empty() ? nullptr : keys_.data();
  spec_.option_values = values_.empty() ? nullptr : values_.data();
  spec_.num_options = static_cast<int32_t>(keys_.size());
}

std::string_view status_name(int32_t status) {
  switch (status) {
    case TESSEL_OK: return "ok";
    case TESSEL_ERROR_INVALID_ARGUMENT: return "invalid_argument";
    case TESSEL_ERROR_UNSUPPORTED: return "unsupported";
    case TESSEL_ERROR_OUT_OF_MEMORY: return "out_of_memory";
    case TESSEL_ERROR_ABI: return "abi";
    case TESSEL_ERROR_INTERNAL: return "internal";
    default: return "unknown status";
  }
}

const tessel_host_api* host_api() {
  static const tessel_host_api api = {
      TESSEL_PLUGIN_ABI_VERSION, static_cast<uint32_t>(sizeof(tessel_host_api)), "0.1.0", host_log,
      host_attention, host_block_sparse_attention, host_validate_block_mask,
      host_attention_with_context, host_block_sparse_attention_with_context,
  };
  return &api;
}

}  // namespace tessel::plugin
