// The UMT5 encoder's bf16 CUDA forward (see umt5_cuda_encoder.h for what runs in which precision).
#include "cuda/umt5_cuda_encoder.h"

#include <cuda_runtime.h>

#include <vector>

#include "cuda/umt5_kernels.h"
#include "cuda/vector_ops.h"
#include "tessel/core/allocator.h"
#include "tessel/core/error.h"
#include "tessel/kernels/cuda/device_guard.h"
#include "tessel/kernels/cuda/launch_check.h"

namespace tessel::diffusion::cuda {
namespace {

using tessel::cuda::CublasLtGemm;
using tessel::cuda::GemmEpilogue;
using tessel::cuda::GemmShape;

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(detail::concat("UMT5 CUDA forward: ", what, ": ", cudaGetErrorString(status)));
}

std::string block_prefix(int64_t layer) { return "encoder.block." + std::to_string(layer) + ".layer."; }

// The norms and the position biases stay fp32; the embedding and the linears go to bf16.
DType device_dtype(const std::string& name) {
  return name.find("layer_norm") != std::string::npos || name.find("relative_attention_bias") != std::string::npos ? DType::kF32
                                                                                                                     : DType::kBF16;
}

}  // namespace

UMT5CudaEncoder::UMT5CudaEncoder(const UMT5Config& config, Device device, const UMT5WeightSource& source)
    : config_(config), device_(device) {
  const tessel::cuda::DeviceGuard guard(device.index);
  const std::vector<WeightSpec> specs = umt5_weight_specs(config_);
  for (const WeightSpec& spec : specs) {
    const DType dtype = device_dtype(spec.name);
    layout_[spec.name] = {weight_bytes_, dtype};
    weight_bytes_ += workspace_slice_bytes(static_cast<size_t>(shape_numel(spec.shape)) * dtype_size(dtype));
  }
  arena_ = allocate(weight_bytes_, MemoryKind::kDevice, device.index);
  for (const WeightSpec& spec : specs) {
    const Tensor stored = source(spec);
    if (stored.shape() != spec.shape) fail_argument("UMT5 weight " + spec.name, shape_str(spec.shape), shape_str(stored.shape()));
    const DType dtype = device_dtype(spec.name);
    void* destination = const_cast<void*>(weight(spec.name));
    if (stored.dtype() == dtype) {
      copy_bytes(destination, device_, stored.data(), Device::cpu(), stored.nbytes());
    } else {
      const Tensor converted = Tensor::empty(spec.shape, dtype);
      copy_convert(stored.view(), converted.view());
      copy_bytes(destination, device_, converted.data(), Device::cpu(), converted.nbytes());
    }
  }
}

const void* UMT5CudaEncoder::weight(const std::string& name) const {
  const auto it = layout_.find(name);
  if (it == layout_.end()) throw Error("UMT5 CUDA encoder: no tensor " + quoted_excerpt(name, 120));
  return static_cast<const std::byte*>(arena_.get()) + it->second.first;
}

void UMT5CudaEncoder::forward(const ExecContext& ctx, const int32_t* ids, const int32_t* mask, int64_t batch, int64_t length,
                              float* out) const {
  const UMT5Config& c = config_;
  if (c.d_kv > kMaxT5HeadDim) fail_argument("UMT5 d_kv", detail::concat("at most ", kMaxT5HeadDim, " on CUDA"), c.d_kv);
  const tessel::cuda::DeviceGuard guard(device_.index);
  const cudaStream_t stream = ctx.device == device_ ? static_cast<cudaStream_t>(ctx.stream) : nullptr;
  const int64_t rows = batch * length, inner = c.num_heads * c.d_kv, dm = c.d_model;

  // The bucket of each relative position (key - query), as the CPU forward computes it.
  std::vector<int32_t> bucket(static_cast<size_t>(2 * length - 1));
  for (int64_t d = -(length - 1); d < length; ++d)
    bucket[static_cast<size_t>(d + length - 1)] = static_cast<int32_t>(
        umt5_relative_position_bucket(d, c.relative_attention_num_buckets, c.relative_attention_max_distance));

  // One generation encodes its prompts once: the activations come from a workspace of the call's own.
  Workspace workspace(device_);
  const auto slices = [&](WorkspaceSlicer* slicer) {
    size_t bytes = 0;
    const auto take = [&](size_t count, size_t element, const char* what) -> void* {
      bytes += workspace_slice_bytes(count * element);
      return slicer ? slicer->take_bytes(count * element, what) : nullptr;
    };
    struct {
      void *scratch, *ids, *mask, *bucket, *hidden, *normed, *q, *k, *v, *attended, *projected, *gate, *up;
    } s{};
    s.scratch = take(CublasLtGemm::kWorkspaceBytes, 1, "GEMM scratch");
    s.ids = take(static_cast<size_t>(rows), sizeof(int32_t), "input ids");
    s.mask = take(static_cast<size_t>(rows), sizeof(int32_t), "attention mask");
    s.bucket = take(bucket.size(), sizeof(int32_t), "position buckets");
    s.hidden = take(static_cast<size_t>(rows * dm), sizeof(float), "residual stream");
    s.normed = take(static_cast<size_t>(rows * dm), 2, "normed");
    s.q = take(static_cast<size_t>(rows * inner), 2, "q");
    s.k = take(static_cast<size_t>(rows * inner), 2, "k");
    s.v = take(static_cast<size_t>(rows * inner), 2, "v");
    s.attended = take(static_cast<size_t>(rows * inner), 2, "attention output");
    s.projected = take(static_cast<size_t>(rows * dm), sizeof(float), "projection");
    s.gate = take(static_cast<size_t>(rows * c.d_ff), 2, "FFN gate");
    s.up = take(static_cast<size_t>(rows * c.d_ff), 2, "FFN up");
    return std::make_pair(s, bytes);
  };
  workspace.reserve(slices(nullptr).second);
  WorkspaceSlicer slicer(workspace);
  const auto a = slices(&slicer).first;
  auto* hidden = static_cast<float*>(a.hidden);
  auto* normed = static_cast<bf16*>(a.normed);
  auto* projected = static_cast<float*>(a.projected);

  check_cuda(cudaMemcpyAsync(a.ids, ids, static_cast<size_t>(rows) * sizeof(int32_t), cudaMemcpyHostToDevice, stream), "ids upload");
  check_cuda(cudaMemcpyAsync(a.mask, mask, static_cast<size_t>(rows) * sizeof(int32_t), cudaMemcpyHostToDevice, stream), "mask upload");
  check_cuda(cudaMemcpyAsync(a.bucket, bucket.data(), bucket.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream), "bucket upload");

  const auto f32 = [&](const std::string& name) { return static_cast<const float*>(weight(name)); };
  const auto linear = [&](const std::string& name, const void* x, int64_t k, int64_t n, void* y, DType output,
                          GemmEpilogue epilogue = GemmEpilogue::kNone) {
    gemm_.linear(GemmShape{rows, n, k, DType::kBF16, output, epilogue}, x, weight(name), nullptr, y, a.scratch, stream);
  };
  const auto eps = static_cast<float>(c.layer_norm_epsilon);

  launch_embedding_gather(static_cast<const int32_t*>(a.ids), static_cast<const bf16*>(weight("shared.weight")), hidden, rows, dm, stream);
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const std::string p = block_prefix(layer);
    launch_t5_rms_norm(hidden, f32(p + "0.layer_norm.weight"), normed, nullptr, rows, dm, eps, stream);
    linear(p + "0.SelfAttention.q.weight", normed, dm, inner, a.q, DType::kBF16);
    linear(p + "0.SelfAttention.k.weight", normed, dm, inner, a.k, DType::kBF16);
    linear(p + "0.SelfAttention.v.weight", normed, dm, inner, a.v, DType::kBF16);
    launch_t5_attention(static_cast<const bf16*>(a.q), static_cast<const bf16*>(a.k), static_cast<const bf16*>(a.v),
                        f32(p + "0.SelfAttention.relative_attention_bias.weight"), static_cast<const int32_t*>(a.bucket),
                        static_cast<const int32_t*>(a.mask), static_cast<bf16*>(a.attended), batch, length, c.num_heads, c.d_kv,
                        stream);
    linear(p + "0.SelfAttention.o.weight", a.attended, inner, dm, projected, DType::kF32);
    launch_add_into(hidden, projected, rows * dm, stream);

    launch_t5_rms_norm(hidden, f32(p + "1.layer_norm.weight"), normed, nullptr, rows, dm, eps, stream);
    linear(p + "1.DenseReluDense.wi_0.weight", normed, dm, c.d_ff, a.gate, DType::kBF16, GemmEpilogue::kGeluTanh);
    linear(p + "1.DenseReluDense.wi_1.weight", normed, dm, c.d_ff, a.up, DType::kBF16);
    launch_gated_product(static_cast<bf16*>(a.gate), static_cast<const bf16*>(a.up), rows * c.d_ff, stream);
    linear(p + "1.DenseReluDense.wo.weight", a.gate, c.d_ff, dm, projected, DType::kF32);
    launch_add_into(hidden, projected, rows * dm, stream);
  }
  launch_t5_rms_norm(hidden, f32("encoder.final_layer_norm.weight"), nullptr, projected, rows, dm, eps, stream);
  tessel::cuda::check_launch("UMT5 CUDA forward");
  check_cuda(cudaMemcpyAsync(out, projected, static_cast<size_t>(rows * dm) * sizeof(float), cudaMemcpyDeviceToHost, stream),
             "output download");
  check_cuda(cudaStreamSynchronize(stream), "synchronization");
}

}  // namespace tessel::diffusion::cuda
