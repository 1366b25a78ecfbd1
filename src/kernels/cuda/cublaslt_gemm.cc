// cuBLASLt linear layers (see cublaslt_gemm.h). cuBLASLt is column-major: the row-major product
// y (m, n) = x (m, k) · w (n, k)^T is, read column-major, y^T (n, m) = w^T · x^T, where the
// row-major w (n, k) is a column-major (k, n) matrix used transposed and the row-major x (m, k) a
// column-major (k, m) one used as is. The bias then runs along y^T's rows: one value per output
// feature, as the epilogue adds it.
//
// libcublasLt is opened at run time, the first time a model needs it, rather than linked: it is
// half a gigabyte that not every machine running tessel's other CUDA code has on its library
// path, and a missing one should fail the CUDA model that needs it with a message, not every
// program that loads libtessel.
#include "tessel/kernels/cuda/cublaslt_gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cuda/linear_epilogue.h"
#include "tessel/core/dynamic_library.h"
#include "tessel/core/error.h"

namespace tessel::cuda {
namespace {

// The cuBLASLt functions this file calls, resolved from the shared library once.
struct CublasLtApi {
#define TESSEL_CUBLASLT_FUNCTIONS(X)                                                                                   \
  X(cublasLtCreate)                                                                                                    \
  X(cublasLtDestroy)                                                                                                   \
  X(cublasLtGetStatusString)                                                                                           \
  X(cublasLtMatmulDescCreate)                                                                                          \
  X(cublasLtMatmulDescDestroy)                                                                                         \
  X(cublasLtMatmulDescSetAttribute)                                                                                    \
  X(cublasLtMatrixLayoutCreate)                                                                                        \
  X(cublasLtMatrixLayoutDestroy)                                                                                       \
  X(cublasLtMatmulPreferenceCreate)                                                                                    \
  X(cublasLtMatmulPreferenceDestroy)                                                                                   \
  X(cublasLtMatmulPreferenceSetAttribute)                                                                              \
  X(cublasLtMatmulAlgoGetHeuristic)                                                                                    \
  X(cublasLtMatmul)
#define TESSEL_CUBLASLT_MEMBER(name) decltype(&::name) name = nullptr;
  TESSEL_CUBLASLT_FUNCTIONS(TESSEL_CUBLASLT_MEMBER)
#undef TESSEL_CUBLASLT_MEMBER
};

// The library of the cuBLAS major version tessel was compiled against (sonames carry it).
constexpr const char* kCublasLtLibrary = "libcublasLt.so." TESSEL_STRINGIFY(CUBLAS_VER_MAJOR);

// Every function of TESSEL_CUBLASLT_FUNCTIONS from the opened library.
void resolve_cublaslt(void* library, CublasLtApi& table) {
#define TESSEL_CUBLASLT_RESOLVE(name) TESSEL_RUNTIME_SYMBOL(table, library, kCublasLtLibrary, name);
  TESSEL_CUBLASLT_FUNCTIONS(TESSEL_CUBLASLT_RESOLVE)
#undef TESSEL_CUBLASLT_RESOLVE
}

const CublasLtApi& cublaslt() {
  static const CublasLtApi api = load_runtime_api<CublasLtApi>(
      kCublasLtLibrary, "tessel's CUDA models need cuBLASLt",
      "put the folder that holds it (the CUDA toolkit's lib64, or the nvidia-cublas Python package's nvidia/cublas/lib) on "
      "LD_LIBRARY_PATH",
      resolve_cublaslt);
  return api;
}

std::string describe(const GemmShape& shape) {
  return detail::concat("the linear (m ", shape.m, ", n ", shape.n, ", k ", shape.k, ", ",
                        shape.fp8_row_scaled ? std::string_view("e4m3 with row scales") : dtype_name(shape.input), " -> ",
                        dtype_name(shape.output), ")");
}

void check(cublasStatus_t status, const char* what, const GemmShape& shape) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(detail::concat("cuBLASLt ", what, " failed for ", describe(shape), ": ", cublaslt().cublasLtGetStatusString(status)));
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF32: return CUDA_R_32F;
    default: throw Error(detail::concat("cuBLASLt linear: element type ", dtype_name(dtype), ", expected bf16 or fp32"));
  }
}

cublasLtEpilogue_t epilogue_of(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kBiasGeluTanh: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case GemmEpilogue::kNone: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::kGeluTanh: return CUBLASLT_EPILOGUE_GELU;
  }
  throw Error("cuBLASLt linear: unknown epilogue");
}

bool has_bias(GemmEpilogue epilogue) { return epilogue == GemmEpilogue::kBias || epilogue == GemmEpilogue::kBiasGeluTanh; }

}  // namespace

struct CublasLtGemm::Plan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t weight = nullptr, input = nullptr, output = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // The fused epilogue had no algorithm (FP8 with outer-vector scales): ours runs after the matmul.
  bool own_epilogue = false;
  // FP8: cuBLASLt applies the row scales (outer-vector mode); else the matmul runs with unit scales
  // and our epilogue applies them.
  bool scales_in_cublaslt = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (output) cublaslt().cublasLtMatrixLayoutDestroy(output);
    if (input) cublaslt().cublasLtMatrixLayoutDestroy(input);
    if (weight) cublaslt().cublasLtMatrixLayoutDestroy(weight);
    if (operation) cublaslt().cublasLtMatmulDescDestroy(operation);
  }
};

CublasLtGemm::CublasLtGemm(Fp8ScaleRoute fp8_route) : fp8_route_(fp8_route) {
  cublasLtHandle_t handle = nullptr;
  const cublasStatus_t status = cublaslt().cublasLtCreate(&handle);
  if (status != CUBLAS_STATUS_SUCCESS) throw Error(detail::concat("cublasLtCreate failed: ", cublaslt().cublasLtGetStatusString(status)));
  handle_ = handle;
}

CublasLtGemm::~CublasLtGemm() {
  plans_.clear();
  if (handle_) cublaslt().cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

namespace {

// The best algorithm cuBLASLt's heuristic has for the described matmul; false when it has none.
// `strict`: a failing heuristic call is an Error; else it counts as "none" too (a combination the
// installed cuBLASLt rejects outright, as it may an epilogue under outer-vector scales).
bool find_algorithm(cublasLtHandle_t handle, cublasLtMatmulDesc_t operation, cublasLtMatrixLayout_t weight,
                    cublasLtMatrixLayout_t input, cublasLtMatrixLayout_t output, const GemmShape& shape, bool strict,
                    cublasLtMatmulAlgo_t& algo) {
  cublasLtMatmulPreference_t preference = nullptr;
  check(cublaslt().cublasLtMatmulPreferenceCreate(&preference), "preference", shape);
  const uint64_t workspace_bytes = CublasLtGemm::kWorkspaceBytes;
  cublasStatus_t status = cublaslt().cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                               &workspace_bytes, sizeof(workspace_bytes));
  // The algorithm must take pointers of the shape's alignment (the default assumes 256 bytes) and
  // rows of the matrices' widths in bytes (a rank-5 bf16 row is 10 bytes; e4m3 rows 1 byte a value).
  const auto lowest_bit = [](int64_t v) { return static_cast<uint32_t>(v & -v); };
  const int64_t input_bytes = shape.fp8_row_scaled ? 1 : static_cast<int64_t>(dtype_size(shape.input));
  const uint32_t input_alignment = std::min(shape.alignment, lowest_bit(shape.k * input_bytes));
  const uint32_t output_alignment = std::min(shape.alignment, lowest_bit(shape.n * static_cast<int64_t>(dtype_size(shape.output))));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, input_alignment}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, input_alignment},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, output_alignment}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, output_alignment}};
  for (const auto& [attribute, bytes] : alignments)
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublaslt().cublasLtMatmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof(bytes));
  // Split-k partial sums only in fp32 (the in-place and output-type schemes would add them in bf16).
  const uint32_t reduction_schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublaslt().cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction_schemes,
                                                  sizeof(reduction_schemes));
  cublasLtMatmulHeuristicResult_t result{};
  int found_algorithms = 0;
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublaslt().cublasLtMatmulAlgoGetHeuristic(handle, operation, weight, input, output, output, preference, 1, &result,
                                            &found_algorithms);
  cublaslt().cublasLtMatmulPreferenceDestroy(preference);
  // The heuristic answers "not supported" for a combination it has no kernel for.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (!strict && status != CUBLAS_STATUS_SUCCESS)) return false;
  check(status, "algorithm heuristic", shape);
  if (found_algorithms == 0) return false;
  algo = result.algo;
  return true;
}

}  // namespace

// How a plan's matmul is configured: whether cuBLASLt applies FP8 row scales (outer-vector mode)
// and whether its epilogue adds the bias / GELU.
struct CublasLtGemm::MatmulChoice {
  bool outer_vector_scales = false;
  bool fused_epilogue = true;
};

// (Re)creates the plan's matmul descriptor for `choice` and asks for an algorithm. false when
// cuBLASLt refuses the combination (an attribute it does not know, or no algorithm) and `strict`
// is off; with `strict` on, that is an Error.
bool CublasLtGemm::configure(Plan& plan, const GemmShape& shape, const MatmulChoice& choice, bool strict) const {
  if (plan.operation) cublaslt().cublasLtMatmulDescDestroy(plan.operation);
  plan.operation = nullptr;
  check(cublaslt().cublasLtMatmulDescCreate(&plan.operation, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor", shape);
  bool accepted = true;
  const auto set = [&](cublasLtMatmulDescAttributes_t attribute, const auto& value, const char* what) {
    const cublasStatus_t status = cublaslt().cublasLtMatmulDescSetAttribute(plan.operation, attribute, &value, sizeof(value));
    if (strict) check(status, what, shape);
    accepted = accepted && status == CUBLAS_STATUS_SUCCESS;
  };
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  set(CUBLASLT_MATMUL_DESC_TRANSA, transpose, "TRANSA");
  set(CUBLASLT_MATMUL_DESC_TRANSB, keep, "TRANSB");
  set(CUBLASLT_MATMUL_DESC_EPILOGUE, choice.fused_epilogue ? epilogue_of(shape.epilogue) : CUBLASLT_EPILOGUE_DEFAULT, "epilogue");
  if (choice.outer_vector_scales) {
    // One fp32 scale per row of op(A) = w (its n output channels) and per column of B = x (its m tokens).
    const int32_t outer_vector = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, outer_vector, "A scale mode (outer vector)");
    set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, outer_vector, "B scale mode (outer vector)");
  }
  if (shape.fp8_row_scaled && choice.fused_epilogue && has_bias(shape.epilogue)) {
    // FP8 matmuls take the bias type as an attribute; the output's, as the bf16 path's epilogue.
    const int32_t bias_type = cuda_type(shape.output);
    set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type, "bias data type");
  }
  if (!accepted) return false;
  return find_algorithm(static_cast<cublasLtHandle_t>(handle_), plan.operation, plan.weight, plan.input, plan.output, shape, strict,
                        plan.algo);
}

const CublasLtGemm::Plan& CublasLtGemm::plan_for(const GemmShape& shape) const {
  const auto found = plans_.find(shape);
  if (found != plans_.end()) return *found->second;
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t input_type = shape.fp8_row_scaled ? CUDA_R_8F_E4M3 : cuda_type(shape.input);
  const cudaDataType_t output_type = cuda_type(shape.output);
  const auto u64 = [](int64_t v) { return static_cast<uint64_t>(v); };
  check(cublaslt().cublasLtMatrixLayoutCreate(&plan->weight, input_type, u64(shape.k), u64(shape.n), shape.k), "weight layout", shape);
  check(cublaslt().cublasLtMatrixLayoutCreate(&plan->input, input_type, u64(shape.k), u64(shape.m), shape.k), "input layout", shape);
  check(cublaslt().cublasLtMatrixLayoutCreate(&plan->output, output_type, u64(shape.n), u64(shape.m), shape.n), "output layout", shape);

  bool found_algorithm = false;
  if (!shape.fp8_row_scaled) {
    found_algorithm = configure(*plan, shape, MatmulChoice{}, true);
  } else {
    // Most fused first: scales and epilogue in cuBLASLt, then scales only, then neither (unit
    // scales; ours applies them with the bias and GELU). Only the last refusal is an Error.
    const bool epilogue = shape.epilogue != GemmEpilogue::kNone;
    std::vector<MatmulChoice> choices;
    if (fp8_route_ == Fp8ScaleRoute::kAuto) {
      if (epilogue) choices.push_back({true, true});
      choices.push_back({true, false});
    }
    choices.push_back({false, false});
    for (size_t i = 0; i < choices.size() && !found_algorithm; ++i) {
      found_algorithm = configure(*plan, shape, choices[i], i + 1 == choices.size());
      plan->scales_in_cublaslt = choices[i].outer_vector_scales;
      plan->own_epilogue = epilogue && !choices[i].fused_epilogue;
    }
  }
  if (!found_algorithm)
    throw Error(detail::concat("cuBLASLt has no algorithm for ", describe(shape),
                               shape.fp8_row_scaled ? " (FP8 matmuls need an sm_89+ GPU)" : ""));
  return *plans_.emplace(shape, std::move(plan)).first->second;
}

uint32_t CublasLtGemm::alignment_of(std::initializer_list<const void*> pointers) {
  uintptr_t bits = 256;
  for (const void* pointer : pointers)
    if (pointer != nullptr) bits |= reinterpret_cast<uintptr_t>(pointer);
  return static_cast<uint32_t>(bits & (~bits + 1));  // the lowest set bit
}

void CublasLtGemm::linear(const GemmShape& shape, const void* x, const void* w, const void* bias, void* y, void* workspace,
                          cudaStream_t stream) const {
  enqueue(shape, x, w, bias, 1.0f, 0.0f, y, workspace, stream);
}

void CublasLtGemm::accumulate(const GemmShape& shape, const void* x, const void* w, float alpha, void* y, void* workspace,
                              cudaStream_t stream) const {
  if (shape.epilogue != GemmEpilogue::kNone)
    throw Error(detail::concat("cuBLASLt accumulate (m ", shape.m, ", n ", shape.n, ", k ", shape.k,
                               "): the epilogue must be none (it would act on what y held before)"));
  enqueue(shape, x, w, nullptr, alpha, 1.0f, y, workspace, stream);
}

void CublasLtGemm::enqueue(const GemmShape& shape, const void* x, const void* w, const void* bias, float alpha, float beta, void* y,
                           void* workspace, cudaStream_t stream) const {
  if (shape.fp8_row_scaled) fail_argument("CublasLtGemm::linear shape.fp8_row_scaled", "false (FP8 operands go through linear_fp8)", "true");
  if (shape.m == 0) return;
  if (alignment_of({x, w, y, bias}) < shape.alignment)
    throw Error(detail::concat("cuBLASLt linear (m ", shape.m, ", n ", shape.n, ", k ", shape.k, "): a pointer is aligned to fewer than the ",
                               shape.alignment, " bytes its shape's alignment says"));
  const std::lock_guard lock(mutex_);
  const Plan& plan = plan_for(shape);
  // The bias pointer lives in the cached descriptor; cuBLASLt reads it when the matmul is enqueued.
  if (has_bias(shape.epilogue))
    check(cublaslt().cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
          "bias pointer", shape);
  // C = D = y: with beta = 1 the matmul adds into y in place (same layout, as cuBLASLt requires).
  check(cublaslt().cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan.operation, &alpha, w, plan.weight, x, plan.input, &beta, y,
                       plan.output, y, plan.output, &plan.algo, workspace, kWorkspaceBytes, stream),
        "matmul", shape);
}

void CublasLtGemm::linear_fp8(const GemmShape& shape, const uint8_t* x, const float* x_scales, const uint8_t* w, const float* w_scales,
                              const void* bias, void* y, void* workspace, cudaStream_t stream) const {
  if (!shape.fp8_row_scaled) fail_argument("CublasLtGemm::linear_fp8 shape.fp8_row_scaled", "true", "false");
  if (shape.output != DType::kBF16)
    fail_argument("FP8 linear output type", "bf16 (row-scaled FP8 matmuls write bf16)", dtype_name(shape.output));
  if (shape.k % 16 != 0 || shape.n % 16 != 0)
    fail_argument(detail::concat("FP8 linear k x n (", describe(shape), ")"), "multiples of 16 (cuBLASLt's FP8 alignment)",
                  detail::concat(shape.k, " x ", shape.n));
  if (shape.m == 0) return;
  const std::lock_guard lock(mutex_);
  const Plan& plan = plan_for(shape);
  // Pointers live in the cached descriptor; cuBLASLt reads them when the matmul is enqueued.
  const auto set_pointer = [&](cublasLtMatmulDescAttributes_t attribute, const void* pointer, const char* what) {
    check(cublaslt().cublasLtMatmulDescSetAttribute(plan.operation, attribute, &pointer, sizeof(pointer)), what, shape);
  };
  if (plan.scales_in_cublaslt) {
    set_pointer(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scales, "A (weight) scale pointer");
    set_pointer(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x_scales, "B (input) scale pointer");
  }
  if (has_bias(shape.epilogue) && !plan.own_epilogue) set_pointer(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "bias pointer");
  const float alpha = 1.0f, beta = 0.0f;
  check(cublaslt().cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan.operation, &alpha, w, plan.weight, x, plan.input, &beta, y,
                       plan.output, y, plan.output, &plan.algo, workspace, kWorkspaceBytes, stream),
        "matmul", shape);
  if (plan.own_epilogue || !plan.scales_in_cublaslt) {
    const bool gelu = shape.epilogue == GemmEpilogue::kBiasGeluTanh || shape.epilogue == GemmEpilogue::kGeluTanh;
    const bool add_bias = plan.own_epilogue && has_bias(shape.epilogue);
    launch_linear_epilogue(y, shape.output, add_bias ? bias : nullptr, shape.m, shape.n, gelu && plan.own_epilogue, stream,
                           plan.scales_in_cublaslt ? nullptr : x_scales, plan.scales_in_cublaslt ? nullptr : w_scales);
  }
}

bool CublasLtGemm::fused_epilogue(const GemmShape& shape) const {
  const std::lock_guard lock(mutex_);
  return !plan_for(shape).own_epilogue;
}

bool CublasLtGemm::fp8_scales_in_cublaslt(const GemmShape& shape) const {
  const std::lock_guard lock(mutex_);
  return plan_for(shape).scales_in_cublaslt;
}

}  // namespace tessel::cuda
