// Linear layers on the GPU through cuBLASLt: y (m, n) = x (m, k) · w (n, k)^T (+ bias (n)),
// row-major, with w a PyTorch Linear weight as stored (out_features, in_features), so no weight is
// transposed. Inputs are bf16 (fp32 accumulation) or fp32 (fp32 compute, no TF32, for the
// conditioning path diffusers keeps in fp32); the output is bf16 or fp32 and the bias has the
// output's type (cuBLASLt's rule for its bias epilogue). GELU with the tanh approximation is fused
// into the epilogue on request (cuBLASLt's GELU is that approximation). Shared by the CUDA models
// (the Wan transformer's linears all have a bias; T5's have none).
//
// FP8 (linear_fp8): x and w in e4m3 with one fp32 scale per row (tessel/kernels/cuda/fp8_rows.h:
// per token and per output channel), fp32 accumulation. That is the "TN" layout Hopper's FP8
// matmul requires (A transposed, B not: both K-major), which is how these row-major operands read
// anyway. The scales take one of two routes, chosen per shape:
//  - cuBLASLt's outer-vector scale mode (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) on A = w and
//    B = x, with the bias / GELU in its epilogue when it has an algorithm for that, else in ours;
//  - where cuBLASLt refuses that scale mode (CUDA 13.0's does on Hopper, for every shape), the
//    matmul runs with unit scales into bf16 and a kernel of ours applies both scale vectors, the
//    bias and GELU in one pass over the output (one more rounding of it, and one more read and
//    write of the output: about a tenth of the FP8 matmul's time at the Wan shapes).
//
// The algorithm for each (m, n, k, types, epilogue) is chosen once by cuBLASLt's heuristic and
// cached with its descriptors, so a run after the first of a shape only enqueues the matmul: no
// allocation, no synchronization, capturable into a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "tessel/core/dtype.h"

namespace tessel::cuda {

// What the matmul's epilogue adds: the bias, the bias then GELU-tanh, nothing, or GELU-tanh alone
// (the bias pointer is then ignored and may be null).
enum class GemmEpilogue { kBias, kBiasGeluTanh, kNone, kGeluTanh };

// Where linear_fp8 applies its per-row scales: kAuto takes cuBLASLt's outer-vector scale mode when
// it has an algorithm for the shape, else our epilogue kernel; kOwnEpilogue always takes ours (tests
// and benchmarks compare the two routes on a cuBLASLt that has both).
enum class Fp8ScaleRoute { kAuto, kOwnEpilogue };

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  DType input = DType::kBF16;   // x and w
  DType output = DType::kBF16;  // y and bias
  GemmEpilogue epilogue = GemmEpilogue::kBias;
  // x and w are e4m3 with per-row fp32 scales (linear_fp8); `input` is then not read.
  bool fp8_row_scaled = false;
  // The alignment in bytes (a power of two, at most 256) that every pointer of the call has: the
  // algorithm is chosen for it and for the rows' widths in bytes. Whole buffers are 256-byte
  // aligned; a slice of rows may be less.
  uint32_t alignment = 256;
  auto tie() const { return std::tie(m, n, k, input, output, epilogue, fp8_row_scaled, alignment); }
  bool operator<(const GemmShape& other) const { return tie() < other.tie(); }
};

class CublasLtGemm {
 public:
  // The scratch each matmul may use (cuBLASLt's recommendation for Hopper); callers pass a slice of
  // at least this many bytes, 256-byte aligned.
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  explicit CublasLtGemm(Fp8ScaleRoute fp8_route = Fp8ScaleRoute::kAuto);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Enqueues y = x · w^T (+ bias) (then GELU-tanh) on `stream`, as shape.epilogue says.
  // `workspace` holds kWorkspaceBytes. Throws Error when cuBLASLt has no algorithm for the shape,
  // a pointer is less aligned than shape.alignment, or a call fails.
  void linear(const GemmShape& shape, const void* x, const void* w, const void* bias, void* y, void* workspace,
              cudaStream_t stream) const;
  // Enqueues y += alpha · x · w^T in place (beta = 1: cuBLASLt reads y in its type; into a bf16 y
  // the product is rounded to bf16 before the addition, so the result is within one bf16 ulp, as
  // measured on the H200), for adding a low-rank update into a linear's output. The shape's
  // epilogue must be kNone (an epilogue after the sum would act on y's earlier part too).
  void accumulate(const GemmShape& shape, const void* x, const void* w, float alpha, void* y, void* workspace,
                  cudaStream_t stream) const;
  // The largest power of two up to 256 that divides every one of `pointers`' addresses (null ones
  // are ignored): the GemmShape::alignment of a call on them.
  static uint32_t alignment_of(std::initializer_list<const void*> pointers);
  // Enqueues y[i, j] = x_scales[i] * w_scales[j] * (x · w^T)[i, j] (+ bias[j]) (then GELU-tanh): x
  // (m, k) and w (n, k) row-major e4m3 bytes, x_scales (m) and w_scales (n) fp32, all on the
  // device. shape.fp8_row_scaled must be set; the output (and bias) bf16 (as PyTorch's row-wise
  // _scaled_mm requires); k and n multiples of 16 (cuBLASLt's FP8 alignment). Throws Error naming
  // the shape otherwise, or when cuBLASLt has no FP8 algorithm at all (a GPU before sm_89).
  void linear_fp8(const GemmShape& shape, const uint8_t* x, const float* x_scales, const uint8_t* w, const float* w_scales,
                  const void* bias, void* y, void* workspace, cudaStream_t stream) const;
  // Whether the bias / GELU of `shape` runs in cuBLASLt's epilogue (false: in ours after the
  // matmul). Plans the shape (tests and benchmarks report it).
  bool fused_epilogue(const GemmShape& shape) const;
  // Whether linear_fp8 applies the row scales of `shape` in cuBLASLt (its outer-vector scale mode)
  // rather than in our epilogue kernel. Plans the shape.
  bool fp8_scales_in_cublaslt(const GemmShape& shape) const;

 private:
  struct Plan;
  struct MatmulChoice;
  const Plan& plan_for(const GemmShape& shape) const;
  bool configure(Plan& plan, const GemmShape& shape, const MatmulChoice& choice, bool strict) const;
  void enqueue(const GemmShape& shape, const void* x, const void* w, const void* bias, float alpha, float beta, void* y,
               void* workspace, cudaStream_t stream) const;

  void* handle_ = nullptr;  // cublasLtHandle_t
  Fp8ScaleRoute fp8_route_;
  mutable std::mutex mutex_;
  mutable std::map<GemmShape, std::unique_ptr<Plan>> plans_;
};

}  // namespace tessel::cuda
