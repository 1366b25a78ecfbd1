// Cross-backend conformance (the test-backend-ops idea): every registered backend (the built-ins,
// plus the example plugin when the build made it) x every pattern it supports x every device
// present (CPU always; CUDA when a GPU is visible) x fp32 / fp16 / bf16 (where the device's dense
// kernel runs the dtype) over a shape matrix with odd lengths, partial last blocks, GQA/MQA,
// q and kv lengths that differ, and empty mask rows. Each case is compared with the fp64
// reference given the very mask the backend executed:
//   - the plan's static mask (in the plan's token order, mapped back through its permutation);
//   - for the data-dependent built-ins, the mask their estimator chooses for these q and k (CPU)
//     or the mask the device estimator left in the plan (CUDA);
//   - for any other backend (plugins, the dense fallback), the mask read back through forward
//     itself: with q = 0 every visible key gets the same weight, so with v one-hot in the kv
//     block id an output channel is non-zero exactly when that block is kept.
// Outputs are poisoned (NaN) first. Tolerance: twice the error of tessel's own dense kernel in
// the same dtype on the same inputs against the fp64 reference (plus a few ulps). Rows whose mask
// keeps no block must give output 0 and lse -inf exactly. The block-sparse kernel itself is also
// run with causal and windowed token rules, which no backend's interface exposes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/attention_test_util.h"
#include "sparse/sparse_test_util.h"
#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/reference.h"
#include "tessel/plugin/plugin_loader.h"
#include "tessel/sparse/backend.h"
#include "tessel/sparse/block_mask.h"
#include "tessel/sparse/config.h"
#include "tessel/sparse/estimators/topk_estimator.h"
#include "tessel/sparse/estimators/xattention_estimator.h"
#include "tessel/sparse/mask_planning.h"
#include "tessel/sparse/pattern_backends.h"
#include "tessel/sparse/registry.h"

namespace tessel {
namespace {

using testing::compare;
using testing::error_floor;
using testing::lse_floor;
using testing::Qkv;
using testing::random_qkv;

struct ShapeCase {
  std::string name;
  int64_t batch, seq_q, seq_kv, heads, kv_heads, head_dim;
  int64_t block_q, block_kv;
};

// What each device's kernels take: the CPU any head dim and block size, so its cases are small
// (16-token q blocks, 8-token kv blocks, head dims 16/32); the CUDA kernels head dims 64/128,
// q blocks of a multiple of 64 and kv blocks of 64 * 2^k. Every sequence ends in a partial block.
struct Geometry {
  int64_t block_q, block_kv;
  std::vector<ShapeCase> sequence_shapes;  // sequence patterns take any lengths
  // Latent-grid patterns attend within one sequence laid out as layout_json says (image_tokens
  // tokens; arrow adds kTextTokens text tokens).
  std::string layout_json;
  int64_t image_tokens;
  int64_t wide_head_dim, narrow_head_dim;

  std::vector<ShapeCase> layout_shapes(int64_t seq) const {
    return {{"grid", 1, seq, seq, 2, 2, wide_head_dim, block_q, block_kv},
            {"grid_gqa_batch2", 2, seq, seq, 4, 2, narrow_head_dim, block_q, block_kv}};
  }
};

constexpr int64_t kTextTokens = 7;

const Geometry& geometry_of(Device device) {
  // 3 frames of a 3 x 5 patch grid = 45 tokens.
  static const Geometry cpu{16, 8,
                            {{"self_odd", 1, 77, 77, 2, 2, 32, 16, 8},
                             {"gqa_batch2", 2, 45, 45, 4, 2, 16, 16, 8},
                             {"cross_mqa", 1, 37, 91, 2, 1, 16, 16, 8}},
                            R"("spatial_layout": {"frames": 3, "height": 6, "width": 10, "patch_size": 2, "ordering": "hilbert"})",
                            45, 32, 16};
  // 3 frames of an 8 x 10 patch grid = 240 tokens, in raster order: a token permutation (hilbert,
  // z-curve) is planned for CPU tensors only, so spatial_aware would decline every CUDA case.
  static const Geometry cuda{64, 64,
                             {{"self_odd", 1, 333, 333, 2, 2, 128, 64, 64},
                              {"gqa_batch2", 2, 200, 200, 4, 2, 64, 64, 64},
                              {"cross_mqa", 1, 150, 391, 2, 1, 64, 64, 64}},
                             R"("spatial_layout": {"frames": 3, "height": 16, "width": 20, "patch_size": 2, "ordering": "raster"})",
                             240, 128, 64};
  return device.is_cuda() ? cuda : cpu;
}

// An explicit mask with empty rows (every third row) and random rows elsewhere.
std::shared_ptr<const BlockMask> mask_with_empty_rows(const ShapeCase& shape) {
  const BlockMaskShape mask_shape{shape.batch, shape.kv_heads, shape.seq_q, shape.seq_kv, shape.block_q, shape.block_kv};
  const BlockMask random = BlockMask::random(mask_shape, 0.4, 17);
  std::vector<std::vector<int32_t>> rows;
  for (int64_t r = 0; r < mask_shape.num_rows(); ++r) {
    const int64_t qb = r % mask_shape.q_blocks(), head = (r / mask_shape.q_blocks()) % mask_shape.mask_heads,
                  batch = r / (mask_shape.q_blocks() * mask_shape.mask_heads);
    rows.push_back(r % 3 == 1 ? std::vector<int32_t>{} : random.row(batch, head, qb));
  }
  return std::make_shared<const BlockMask>(BlockMask::from_rows(mask_shape, rows));
}

// `fields`: the JSON object's members besides the block sizes (which nested specs inherit).
PatternSpec spec_from_json(const Geometry& g, const std::string& fields) {
  return ResolvedSparseAttnConfig(parse_sparse_attn_json(detail::concat(
                                      R"({"block_size_q": )", g.block_q, R"(, "block_size_kv": )", g.block_kv, ", ", fields, "}")))
      .pattern();
}

struct PatternCase {
  PatternSpec spec;
  std::vector<ShapeCase> shapes;
};

// The spec and shapes each pattern type is exercised with (block_sparse's mask depends on the
// shape and is filled in per case).
PatternCase pattern_case(PatternType type, const Geometry& g) {
  const std::string& layout = g.layout_json;
  switch (type) {
    case PatternType::kDense: return {spec_from_json(g, R"("pattern_type": "dense")"), g.sequence_shapes};
    case PatternType::kBlockSparse: {
      PatternSpec spec;
      spec.type = PatternType::kBlockSparse;
      spec.block_q = g.block_q;
      spec.block_kv = g.block_kv;
      return {spec, g.sequence_shapes};
    }
    case PatternType::kSlidingWindow:
      return {spec_from_json(g, R"("pattern_type": "sliding_window", "window_size": 20, "sink_blocks": 1)"),
              g.sequence_shapes};
    case PatternType::kDynamicTopk:
      return {spec_from_json(g, R"("pattern_type": "dynamic_topk", "topk_ratio": 0.4, "keep_diagonal": true)"),
              g.sequence_shapes};
    case PatternType::kThreshold:
      return {spec_from_json(g, R"("pattern_type": "threshold", "threshold": 0.8, "stride": 8)"), g.sequence_shapes};
    case PatternType::kSpatialAware:
      return {spec_from_json(g, R"("pattern_type": "spatial_aware", "spatial_radius": 1, )" + layout),
              g.layout_shapes(g.image_tokens)};
    case PatternType::kRadial:
      return {spec_from_json(g, R"("pattern_type": "radial", "decay_factor": 1.0, )" + layout),
              g.layout_shapes(g.image_tokens)};
    case PatternType::kLocal:
      return {spec_from_json(g, R"("pattern_type": "local", "local_window_size": 1, )" + layout),
              g.layout_shapes(g.image_tokens)};
    case PatternType::kArrow:
      return {spec_from_json(g, R"("pattern_type": "arrow", "i2i_pattern_type": "radial", "num_text_tokens": 7, )" + layout),
              g.layout_shapes(g.image_tokens + kTextTokens)};
    case PatternType::kComposite:
      return {spec_from_json(g, R"("pattern_type": "composite", "children": ["radial", "local"], "local_window_size": 1, )" +
                             layout),
              g.layout_shapes(g.image_tokens)};
    case PatternType::kHeadClassify:
      return {spec_from_json(g, R"("pattern_type": "head_classify", "spatial_radius": 1, )" + layout),
              g.layout_shapes(g.image_tokens)};
  }
  throw Error("unknown pattern type");
}

// The module type a shape is attended as: self attention, or a prefill chunk when q and kv lengths
// differ; the first of those the backend supports.
std::optional<ModuleType> module_for(const Backend& backend, const ShapeCase& shape) {
  const std::vector<ModuleType> preferred =
      shape.seq_q == shape.seq_kv
          ? std::vector<ModuleType>{ModuleType::kDitSelf, ModuleType::kDitJoint, ModuleType::kLlmPrefill}
          : std::vector<ModuleType>{ModuleType::kDitCross, ModuleType::kLlmPrefill, ModuleType::kLlmDecode};
  for (ModuleType module : preferred)
    if (backend.supports(module)) return module;
  return std::nullopt;
}

Tensor poisoned(const Shape& shape, DType dtype, Device device) {
  return testing::poisoned(shape, dtype).to(device);
}

// The fp64 reference for `mask` (over the token order `permutation`, identity when empty),
// reported in the caller's token order.
reference::AttentionResult masked_reference(const Qkv& t, const BlockMask& mask, const std::vector<int64_t>& permutation) {
  if (permutation.empty()) return reference::block_sparse_attention(t.q, t.k, t.v, mask.view());
  const reference::AttentionResult permuted = reference::block_sparse_attention(
      testing::gather_tokens(t.q, permutation), testing::gather_tokens(t.k, permutation),
      testing::gather_tokens(t.v, permutation), mask.view());
  reference::AttentionResult out = permuted;
  const int64_t rows = permuted.rows(), heads = permuted.heads, dim = permuted.head_dim;
  for (int64_t b = 0; b < permuted.batch; ++b)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t user_row = permutation[static_cast<size_t>(r)];
      for (int64_t h = 0; h < heads; ++h) {
        out.lse[static_cast<size_t>((b * heads + h) * rows + user_row)] = permuted.lse_at(b, h, r);
        for (int64_t d = 0; d < dim; ++d)
          out.out[static_cast<size_t>(((b * rows + user_row) * heads + h) * dim + d)] = permuted.out_at(b, r, h, d);
      }
    }
  return out;
}

// Reads the mask a data-independent plan executes back through forward (see the file comment):
// one (batch, q head, q block) row per mask row, a block kept when any query of the q block sees it.
BlockMask probe_executed_mask(Impl& impl, const Metadata& metadata, const ShapeCase& shape, DType dtype, Device device) {
  const BlockMaskShape mask_shape{shape.batch, shape.heads, shape.seq_q, shape.seq_kv, shape.block_q, shape.block_kv};
  const int64_t kv_blocks = mask_shape.kv_blocks(), dim = shape.head_dim;
  std::vector<uint8_t> dense(static_cast<size_t>(mask_shape.num_rows() * kv_blocks), 0);
  Tensor q = Tensor::zeros({shape.batch, shape.seq_q, shape.heads, dim}, dtype);
  Tensor k = Tensor::zeros({shape.batch, shape.seq_kv, shape.kv_heads, dim}, dtype);
  fill_normal(k.view(), 5);
  for (int64_t first = 0; first < kv_blocks; first += dim) {
    // Channel c of v is 1 on the keys of kv block first + c.
    Tensor v = Tensor::zeros({shape.batch, shape.seq_kv, shape.kv_heads, dim}, DType::kF32);
    for (int64_t b = 0; b < shape.batch; ++b)
      for (int64_t j = 0; j < shape.seq_kv; ++j)
        for (int64_t h = 0; h < shape.kv_heads; ++h) {
          const int64_t c = j / shape.block_kv - first;
          if (c >= 0 && c < dim) v.data_as<float>()[((b * shape.seq_kv + j) * shape.kv_heads + h) * dim + c] = 1.0f;
        }
    Tensor out = poisoned(q.shape(), dtype, device);
    impl.forward(ExecContext{}, q.to(device), k.to(device), v.to(dtype).to(device), metadata, StepInfo{}, out, TensorView{});
    const Tensor host_out = out.to(Device::cpu());
    for (int64_t b = 0; b < shape.batch; ++b)
      for (int64_t i = 0; i < shape.seq_q; ++i)
        for (int64_t h = 0; h < shape.heads; ++h)
          for (int64_t c = 0; c < dim && first + c < kv_blocks; ++c) {
            const double value = element_as_double(host_out, ((b * shape.seq_q + i) * shape.heads + h) * dim + c);
            if (value != 0.0) {
              const int64_t row = (b * shape.heads + h) * mask_shape.q_blocks() + i / shape.block_q;
              dense[static_cast<size_t>(row * kv_blocks + first + c)] = 1;
            }
          }
  }
  return BlockMask::from_dense(mask_shape, dense);
}

// The mask the backend executed in the forward just run on `t`, and its token order.
struct ExecutedMask {
  BlockMask mask;
  std::vector<int64_t> permutation;
};

ExecutedMask executed_mask(const Backend& backend, Impl& impl, const Metadata& metadata, const Qkv& t,
                           const ShapeCase& shape, Device device) {
  if (metadata.mask) return {*metadata.mask, metadata.permutation};
  const PatternType type = metadata.spec.type;
  const bool estimating_builtin =
      backend.origin() == "built-in" && (type == PatternType::kDynamicTopk || type == PatternType::kThreshold) &&
      (backend.name() == "dynamic_topk" || backend.name() == "threshold");
  if (estimating_builtin && device.is_cuda()) return {device_estimated_mask(metadata), {}};
  if (backend.origin() == "built-in" && backend.name() == "head_classify") {  // its probe, redone
    const HeadClassifierOptions o = head_classifier_options_from_spec(metadata.spec);
    const HeadClassPlans plans = plan_head_classes(token_layout_from_spec(metadata.spec), o);
    const HeadProbe probe = probe_head_classes(ExecContext{}, t.q, t.k, plans, o);
    return {apply_always_keep(metadata.spec, head_class_mask(plans, probe.classes)), metadata.permutation};
  }
  if (estimating_builtin) {
    const BlockMask chosen = type == PatternType::kDynamicTopk
                                 ? estimate_topk_mask(ExecContext{}, t.q, t.k, topk_options_from_spec(metadata.spec)).mask
                                 : estimate_xattention_mask(ExecContext{}, t.q, t.k, xattention_options_from_spec(metadata.spec)).mask;
    return {apply_always_keep(metadata.spec, chosen), {}};
  }
  return {probe_executed_mask(impl, metadata, shape, t.q.dtype(), device), {}};
}

// The dense kernel's error on these inputs: the yardstick of every tolerance.
testing::Errors dense_kernel_error(const Qkv& t, Device device) {
  const reference::AttentionResult exact = reference::attention(t.q, t.k, t.v);
  Tensor out = poisoned(t.q.shape(), t.q.dtype(), device);
  Tensor lse = poisoned({t.q.size(0), t.q.size(2), t.q.size(1)}, DType::kF32, device);
  attention_forward(ExecContext{}, t.q.to(device), t.k.to(device), t.v.to(device), out, lse);
  return compare(out.to(Device::cpu()), lse.to(Device::cpu()), exact);
}

// Compares a result with the reference under the conformance tolerance; rows the mask leaves
// empty must be exactly 0 with lse -inf.
void expect_conformant(const Tensor& out_device, const Tensor& lse_device, const reference::AttentionResult& expected,
                       const testing::Errors& dense_error, DType dtype) {
  const Tensor out = out_device.to(Device::cpu()), lse = lse_device.to(Device::cpu());
  const testing::Errors got = compare(out, lse, expected);
  EXPECT_TRUE(got.finite) << "NaN/inf left in the output (poisoned before the call)";
  EXPECT_TRUE(got.lse_pattern_ok) << "lse is -inf on other rows than the reference's empty rows";
  EXPECT_LE(got.out, 2 * dense_error.out + error_floor(dtype)) << "dense kernel error " << dense_error.out;
  EXPECT_LE(got.lse, 2 * dense_error.lse + lse_floor(dtype)) << "dense kernel lse error " << dense_error.lse;
  const int64_t seq_q = out.size(1), heads = out.size(2), dim = out.size(3);
  int64_t nonzero_in_empty_rows = 0;
  for (int64_t b = 0; b < expected.batch; ++b)
    for (int64_t i = 0; i < seq_q; ++i)
      for (int64_t h = 0; h < heads; ++h) {
        if (!std::isinf(expected.lse_at(b, h, i))) continue;
        for (int64_t d = 0; d < dim; ++d)
          nonzero_in_empty_rows += element_as_double(out, ((b * seq_q + i) * heads + h) * dim + d) != 0.0;
      }
  EXPECT_EQ(nonzero_in_empty_rows, 0) << "rows with no kept block must be exactly 0";
}

std::vector<DType> dtypes_of(Device device) {
  std::vector<DType> supported;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    // A head dim every device geometry uses (the CUDA kernels take 64 and 128 only).
    const Qkv t = random_qkv(1, 8, 8, 1, 1, geometry_of(device).narrow_head_dim, dtype, 1);
    try {
      dense_kernel_error(t, device);
      supported.push_back(dtype);
    } catch (const Error& e) {
      std::printf("[conformance] %s: %s not run (the dense kernel does not take it: %s)\n", device.str().c_str(),
                  std::string(dtype_name(dtype)).c_str(), e.what());
    }
  }
  return supported;
}

std::vector<std::shared_ptr<Backend>> backends_under_test(BackendRegistry& registry) {
  std::vector<std::shared_ptr<Backend>> backends = registry.list();
  if (std::filesystem::exists(testing::example_plugin_path()))
    backends.push_back(registry.load_plugin(testing::example_plugin_path()));
  else
    std::printf("[conformance] example plugin not built (%s): plugin cases not run\n",
                testing::example_plugin_path().c_str());
  return backends;
}

struct Tally {
  int run = 0;
  std::map<std::string, int> run_per_backend;
  std::vector<std::string> declined;  // plan() refused the case: backend, case and reason
};

void run_case(const Backend& backend, PatternType type, const PatternCase& pattern, const ShapeCase& shape, DType dtype,
              Device device, uint64_t seed, Tally& tally) {
  const std::string label = detail::concat(backend.name(), " ", pattern_type_name(type), " ", shape.name, " ",
                                           dtype_name(dtype), " ", device.str());
  SCOPED_TRACE(label);
  const std::optional<ModuleType> module = module_for(backend, shape);
  if (!module) {
    tally.declined.push_back(label + ": no module type for this shape");
    return;
  }
  PatternSpec spec = pattern.spec;
  if (type == PatternType::kBlockSparse) spec.block_mask = mask_with_empty_rows(shape);
  const AttentionShape attention_shape{shape.batch, shape.heads, shape.kv_heads, shape.head_dim,
                                       shape.seq_q, shape.seq_kv, dtype, device};
  std::shared_ptr<Metadata> metadata;
  try {
    metadata = backend.make_metadata_builder()->plan(ExecContext{}, spec, *module, attention_shape);
  } catch (const Error& e) {
    tally.declined.push_back(label + ": " + e.what());
    return;
  }
  const Qkv t = random_qkv(shape.batch, shape.seq_q, shape.seq_kv, shape.heads, shape.kv_heads, shape.head_dim, dtype, seed);
  const std::unique_ptr<Impl> impl = backend.make_impl();
  Tensor out = poisoned(t.q.shape(), dtype, device);
  Tensor lse = poisoned({shape.batch, shape.heads, shape.seq_q}, DType::kF32, device);
  impl->forward(ExecContext{}, t.q.to(device), t.k.to(device), t.v.to(device), *metadata, StepInfo{}, out, lse);
  const ExecutedMask executed = executed_mask(backend, *impl, *metadata, t, shape, device);
  expect_conformant(out, lse, masked_reference(t, executed.mask, executed.permutation), dense_kernel_error(t, device), dtype);
  ++tally.run;
  ++tally.run_per_backend[backend.name()];
}

void run_backend_conformance(Device device) {
  // Built-ins plus the plugin loader: the example plugin is loaded by path below.
  const std::unique_ptr<BackendRegistry> owned = make_default_registry(/*discover_plugins=*/false);
  BackendRegistry& registry = *owned;
  const std::vector<DType> dtypes = dtypes_of(device);
  ASSERT_FALSE(dtypes.empty()) << "the dense kernel takes no dtype on " << device.str();
  Tally tally;
  uint64_t seed = 100;
  for (const std::shared_ptr<Backend>& backend : backends_under_test(registry)) {
    if (!backend->supports(device.type)) continue;
    if (backend->supported_patterns().empty()) {  // e.g. a KV-cache policy: it makes no attention Impl
      std::printf("[conformance] backend '%s' supports no attention pattern: not run\n", backend->name().c_str());
      continue;
    }
    for (PatternType type : backend->supported_patterns()) {
      const PatternCase pattern = pattern_case(type, geometry_of(device));
      for (const ShapeCase& shape : pattern.shapes)
        for (DType dtype : dtypes) run_case(*backend, type, pattern, shape, dtype, device, ++seed, tally);
    }
    EXPECT_GT(tally.run_per_backend[backend->name()], 0) << "backend '" << backend->name() << "' ran no case on "
                                                         << device.str();
  }
  std::printf("[conformance] %s: %d cases run", device.str().c_str(), tally.run);
  for (const auto& [name, count] : tally.run_per_backend) std::printf(", %s %d", name.c_str(), count);
  std::printf("; %zu declined at plan time:\n", tally.declined.size());
  for (const std::string& line : tally.declined) std::printf("  %s\n", line.c_str());
}

// The kernel layer's block-sparse entry point with the token rules backends do not expose.
void run_kernel_conformance(Device device) {
  int cases = 0;
  uint64_t seed = 500;
  const std::vector<AttentionOptions> rules = {
      {0.0f, true, -1, -1},   // causal (bottom-right aligned when lengths differ)
      {0.0f, false, 13, 5},   // a token window
      {0.0f, true, 30, -1},   // causal with a left window
  };
  for (DType dtype : dtypes_of(device))
    for (const ShapeCase& shape : geometry_of(device).sequence_shapes)
      for (const AttentionOptions& options : rules) {
        SCOPED_TRACE(detail::concat("block_sparse_attention_forward ", shape.name, " ", dtype_name(dtype), " ",
                                    device.str(), " causal ", options.causal, " window ", options.window_left, "/",
                                    options.window_right));
        const Qkv t = random_qkv(shape.batch, shape.seq_q, shape.seq_kv, shape.heads, shape.kv_heads, shape.head_dim,
                                 dtype, ++seed);
        const std::shared_ptr<const BlockMask> mask = mask_with_empty_rows(shape);
        Tensor out = poisoned(t.q.shape(), dtype, device);
        Tensor lse = poisoned({shape.batch, shape.heads, shape.seq_q}, DType::kF32, device);
        if (device.is_cuda()) {
          const BlockMask::DeviceCopy device_mask = mask->to_device(device);
          block_sparse_attention_forward(ExecContext{}, t.q.to(device), t.k.to(device), t.v.to(device), device_mask.view(), out, lse, options);
        } else {
          block_sparse_attention_forward(ExecContext{}, t.q, t.k, t.v, mask->view(), out, lse, options);
        }
        expect_conformant(out, lse, reference::block_sparse_attention(t.q, t.k, t.v, mask->view(), options),
                          dense_kernel_error(t, device), dtype);
        ++cases;
      }
  std::printf("[conformance] %s: %d block-sparse kernel cases with token rules\n", device.str().c_str(), cases);
  EXPECT_GT(cases, 0) << "no block-sparse kernel case ran on " << device.str();
}

constexpr const char* kNoGpu = "no CUDA GPU visible (or tessel built without CUDA): CUDA cases skipped";

TEST(BackendConformance, EveryBackendOnCpu) { run_backend_conformance(Device::cpu()); }

TEST(BackendConformance, BlockSparseKernelTokenRulesOnCpu) { run_kernel_conformance(Device::cpu()); }

TEST(BackendConformance, EveryBackendOnCuda) {
  if (!cuda_available()) GTEST_SKIP() << kNoGpu;
  run_backend_conformance(Device::cuda(0));
}

TEST(BackendConformance, BlockSparseKernelTokenRulesOnCuda) {
  if (!cuda_available()) GTEST_SKIP() << kNoGpu;
  run_kernel_conformance(Device::cuda(0));
}

}  // namespace
}  // namespace tessel
