// The UMT5 encoder's forward on one CUDA device (internal; UMT5Encoder owns one when it is built
// for a CUDA device). The same operations as the CPU forward (umt5_encoder.h), with:
//   - the token embedding and every linear weight in bf16 in one device arena (UMT5-XXL: 11 GB),
//     the RMSNorm weights and the relative position biases in fp32;
//   - the linears through cuBLASLt (bf16 in, fp32 accumulation; T5's linears have no bias, the
//     gate's GELU-tanh is the epilogue of its GEMM);
//   - the residual stream and every RMSNorm in fp32 (transformers keeps T5's norm statistics in
//     fp32 too), what feeds a GEMM rounded once to bf16;
//   - self-attention with the relative position bias and the padding mask in one kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/diffusion/umt5_encoder.h"
#include "tessel/kernels/cuda/cublaslt_gemm.h"

namespace tessel::diffusion::cuda {

// The stored tensor of one spec of umt5_weight_specs(config): a CPU tensor of any float dtype.
using UMT5WeightSource = std::function<Tensor(const WeightSpec&)>;

class UMT5CudaEncoder {
 public:
  // Uploads the tensors `source` gives, one at a time (a host copy of one tensor at most).
  UMT5CudaEncoder(const UMT5Config& config, Device device, const UMT5WeightSource& source);
  UMT5CudaEncoder(const UMT5CudaEncoder&) = delete;
  UMT5CudaEncoder& operator=(const UMT5CudaEncoder&) = delete;

  // ids and mask (batch, length) int32 host memory, checked by the caller; out (batch, length,
  // d_model) fp32 host memory. Runs on ctx.stream (when ctx is on this device) and waits for it.
  void forward(const ExecContext& ctx, const int32_t* ids, const int32_t* mask, int64_t batch, int64_t length, float* out) const;

  size_t weight_bytes() const { return weight_bytes_; }

 private:
  const void* weight(const std::string& name) const;

  UMT5Config config_;
  Device device_;
  std::shared_ptr<void> arena_;
  size_t weight_bytes_ = 0;
  std::map<std::string, std::pair<size_t, DType>> layout_;  // tensor name -> (arena offset, device dtype)
  tessel::cuda::CublasLtGemm gemm_;
};

}  // namespace tessel::diffusion::cuda
