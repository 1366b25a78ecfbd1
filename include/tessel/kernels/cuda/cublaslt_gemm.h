// Linear layers on the GPU through cuBLASLt: y (m, n) = x (m, k) · w (n, k)^T (+ bias (n)),
// row-major, with w a PyTorch Linear weight as stored (out_features, in_features), so no weight is
// transposed. Inputs are bf16 (fp32 accumulation) or fp32 (fp32 compute, no TF32, for the
// conditioning path diffusers keeps in fp32); the output is bf16 or fp32 and the bias has the
// output's type (cuBLASLt's rule for its bias epilogue). GELU with the tanh approximation is fused
// into the epilogue on request (cuBLASLt's GELU is that approximation). Shared by the CUDA models
// (the Wan transformer's linears all have a bias; T5's have none).
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

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  DType input = DType::kBF16;   // x and w
  DType output = DType::kBF16;  // y and bias
  GemmEpilogue epilogue = GemmEpilogue::kBias;
  // The alignment in bytes (a power of two, at most 256) that every pointer of the call has: the
  // algorithm is chosen for it and for the rows' widths in bytes. Whole buffers are 256-byte
  // aligned; a slice of rows may be less.
  uint32_t alignment = 256;
  auto tie() const { return std::tie(m, n, k, input, output, epilogue, alignment); }
  bool operator<(const GemmShape& other) const { return tie() < other.tie(); }
};

class CublasLtGemm {
 public:
  // The scratch each matmul may use (cuBLASLt's recommendation for Hopper); callers pass a slice of
  // at least this many bytes, 256-byte aligned.
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  CublasLtGemm();
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Enqueues y = x · w^T (+ bias) (then GELU-tanh) on `stream`, as shape.epilogue says.
  // `workspace` holds kWorkspaceBytes. Throws Error when cuBLASLt has no algorithm for the shape,
  // a pointer is less aligned than shape.alignment, or a call fails.
  void linear(const GemmShape& shape, const void* x, const void* w, const void* bias, void* y, void* workspace,
              cudaStream_t stream) const;

  // Enqueues y += alpha · x · w^T in place (beta = 1: cuBLASLt reads y in its type, adds in fp32 and
  // rounds once to y's type), for adding a low-rank update into a linear's output. The shape's
  // epilogue must be kNone (an epilogue after the sum would act on y's earlier part too).
  void accumulate(const GemmShape& shape, const void* x, const void* w, float alpha, void* y, void* workspace,
                  cudaStream_t stream) const;

  // The largest power of two up to 256 that divides every one of `pointers`' addresses (null ones
  // are ignored): the GemmShape::alignment of a call on them.
  static uint32_t alignment_of(std::initializer_list<const void*> pointers);

 private:
  struct Plan;
  const Plan& plan_for(const GemmShape& shape) const;
  void enqueue(const GemmShape& shape, const void* x, const void* w, const void* bias, float alpha, float beta, void* y,
               void* workspace, cudaStream_t stream) const;

  void* handle_ = nullptr;  // cublasLtHandle_t
  mutable std::mutex mutex_;
  mutable std::map<GemmShape, std::unique_ptr<Plan>> plans_;
};

}  // namespace tessel::cuda
