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
#include <utility>

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

void check(cublasStatus_t status, const char* what, const GemmShape& shape) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(detail::concat("cuBLASLt ", what, " failed for the linear (m ", shape.m, ", n ", shape.n, ", k ", shape.k, ", ",
                               dtype_name(shape.input), " -> ", dtype_name(shape.output),
                               "): ", cublaslt().cublasLtGetStatusString(status)));
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

CublasLtGemm::CublasLtGemm() {
  cublasLtHandle_t handle = nullptr;
  const cublasStatus_t status = cublaslt().cublasLtCreate(&handle);
  if (status != CUBLAS_STATUS_SUCCESS) throw Error(detail::concat("cublasLtCreate failed: ", cublaslt().cublasLtGetStatusString(status)));
  handle_ = handle;
}

CublasLtGemm::~CublasLtGemm() {
  plans_.clear();
  if (handle_) cublaslt().cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

const CublasLtGemm::Plan& CublasLtGemm::plan_for(const GemmShape& shape) const {
  const auto found = plans_.find(shape);
  if (found != plans_.end()) return *found->second;
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t input_type = cuda_type(shape.input), output_type = cuda_type(shape.output);
  check(cublaslt().cublasLtMatmulDescCreate(&plan->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor", shape);
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  check(cublaslt().cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)), "TRANSA",
        shape);
  check(cublaslt().cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)), "TRANSB", shape);
  const cublasLtEpilogue_t epilogue = epilogue_of(shape.epilogue);
  check(cublaslt().cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)), "epilogue",
        shape);
  const auto u64 = [](int64_t v) { return static_cast<uint64_t>(v); };
  check(cublaslt().cublasLtMatrixLayoutCreate(&plan->weight, input_type, u64(shape.k), u64(shape.n), shape.k), "weight layout", shape);
  check(cublaslt().cublasLtMatrixLayoutCreate(&plan->input, input_type, u64(shape.k), u64(shape.m), shape.k), "input layout", shape);
  check(cublaslt().cublasLtMatrixLayoutCreate(&plan->output, output_type, u64(shape.n), u64(shape.m), shape.n), "output layout", shape);

  cublasLtMatmulPreference_t preference = nullptr;
  check(cublaslt().cublasLtMatmulPreferenceCreate(&preference), "preference", shape);
  const uint64_t workspace_bytes = kWorkspaceBytes;
  cublasStatus_t status = cublaslt().cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                               &workspace_bytes, sizeof(workspace_bytes));
  // The algorithm must take pointers of the shape's alignment (the default assumes 256 bytes) and
  // rows of the matrices' widths in bytes (a rank-5 bf16 row is 10 bytes).
  const auto lowest_bit = [](int64_t v) { return static_cast<uint32_t>(v & -v); };
  const uint32_t input_alignment = std::min(shape.alignment, lowest_bit(shape.k * static_cast<int64_t>(dtype_size(shape.input))));
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
    status = cublaslt().cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), plan->operation, plan->weight, plan->input,
                                            plan->output, plan->output, preference, 1, &result, &found_algorithms);
  cublaslt().cublasLtMatmulPreferenceDestroy(preference);
  check(status, "algorithm heuristic", shape);
  if (found_algorithms == 0)
    throw Error(detail::concat("cuBLASLt has no algorithm for the linear (m ", shape.m, ", n ", shape.n, ", k ", shape.k, ", ",
                               dtype_name(shape.input), " -> ", dtype_name(shape.output), ")"));
  plan->algo = result.algo;
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

}  // namespace tessel::cuda
