// The CLIP vision encoder's fp32 CUDA forward (see clip_cuda_encoder.h).
#include "cuda/clip_cuda_encoder.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>

#include "cuda/clip_kernels.h"
#include "cuda/vector_ops.h"
#include "tessel/core/error.h"
#include "tessel/kernels/cuda/device_guard.h"
#include "tessel/kernels/cuda/launch_check.h"

namespace tessel::diffusion::cuda {
namespace {

using tessel::cuda::CublasLtGemm;
using tessel::cuda::GemmEpilogue;
using tessel::cuda::GemmShape;

constexpr const char* kPrefix = "vision_model.";

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(detail::concat("CLIP vision CUDA forward: ", what, ": ", cudaGetErrorString(status)));
}

Tensor f32(const Tensor& t) { return t.dtype() == DType::kF32 ? t : t.to(DType::kF32); }

// Host tensors of the same trailing shape stacked on the first axis, in fp32.
Tensor stacked(const std::vector<const Tensor*>& parts) {
  Shape shape = parts.front()->shape();
  shape[0] = 0;
  for (const Tensor* part : parts) shape[0] += part->size(0);
  Tensor result = Tensor::empty(shape, DType::kF32);
  char* target = static_cast<char*>(result.data());
  for (const Tensor* part : parts) {
    const Tensor values = f32(*part);
    std::memcpy(target, values.data(), values.nbytes());
    target += values.nbytes();
  }
  return result;
}

}  // namespace

ClipCudaEncoder::ClipCudaEncoder(const ClipVisionConfig& config, const std::map<std::string, Tensor>& weights, Device device)
    : config_(config), device_(device) {
  const int64_t head_dim = config.hidden_size / config.num_attention_heads;
  if (head_dim > kMaxClipHeadDim)
    fail_argument("CLIP vision head dim (hidden_size / num_attention_heads)", detail::concat("at most ", kMaxClipHeadDim, " on CUDA"),
                  head_dim);
  const tessel::cuda::DeviceGuard guard(device.index);
  const auto upload = [&](const std::string& name) { return f32(weights.at(name)).to(device); };
  const auto linear = [&](const std::string& name, bool has_bias) {
    return Linear{upload(name + ".weight"), has_bias ? upload(name + ".bias") : Tensor{}};
  };
  const std::string e = std::string(kPrefix) + "embeddings.";
  patch_embedding_ = linear(e + "patch_embedding", false);  // (hidden, c, p, p): a (hidden, c p p) GEMM weight
  class_embedding_ = upload(e + "class_embedding");
  position_embedding_ = upload(e + "position_embedding.weight");
  pre_norm_weight_ = upload(std::string(kPrefix) + "pre_layrnorm.weight");
  pre_norm_bias_ = upload(std::string(kPrefix) + "pre_layrnorm.bias");
  for (int64_t index = 0; index + 1 < config_.num_hidden_layers; ++index) {
    const std::string p = std::string(kPrefix) + "encoder.layers." + std::to_string(index) + ".";
    const auto part = [&](const char* projection, const char* kind) { return &weights.at(p + "self_attn." + projection + kind); };
    Linear qkv{stacked({part("q_proj", ".weight"), part("k_proj", ".weight"), part("v_proj", ".weight")}).to(device),
               stacked({part("q_proj", ".bias"), part("k_proj", ".bias"), part("v_proj", ".bias")}).to(device)};
    layers_.push_back(Layer{upload(p + "layer_norm1.weight"), upload(p + "layer_norm1.bias"), upload(p + "layer_norm2.weight"),
                            upload(p + "layer_norm2.bias"), std::move(qkv), linear(p + "self_attn.out_proj", true),
                            linear(p + "mlp.fc1", true), linear(p + "mlp.fc2", true)});
  }
}

void ClipCudaEncoder::linear(const Linear& layer, const float* x, int64_t rows, float* y, void* scratch, cudaStream_t stream) const {
  const int64_t out = layer.weight.size(0), in = layer.weight.numel() / out;
  const GemmEpilogue epilogue = layer.bias.defined() ? GemmEpilogue::kBias : GemmEpilogue::kNone;
  gemm_.linear(GemmShape{rows, out, in, DType::kF32, DType::kF32, epilogue}, x, layer.weight.data(),
               layer.bias.defined() ? layer.bias.data() : nullptr, y, scratch, stream);
}

void ClipCudaEncoder::forward(const ExecContext& ctx, const float* pixels, int64_t batch, float* out) const {
  const ClipVisionConfig& c = config_;
  const int64_t heads = c.num_attention_heads, hidden = c.hidden_size, head_dim = hidden / heads;
  const tessel::cuda::DeviceGuard guard(device_.index);
  const cudaStream_t stream = ctx.device == device_ ? static_cast<cudaStream_t>(ctx.stream) : nullptr;
  const int64_t tokens = c.tokens(), rows = batch * tokens, patches = tokens - 1, side = c.image_size;
  const int64_t patch_values = c.num_channels * c.patch_size * c.patch_size, pixel_count = batch * c.num_channels * side * side;

  // One request encodes its image(s) once: the activations come from a workspace of the call's own.
  Workspace workspace(device_);
  const auto slices = [&](WorkspaceSlicer* slicer) {
    size_t bytes = 0;
    const auto take = [&](int64_t floats, const char* what) -> float* {
      const size_t size = static_cast<size_t>(floats) * sizeof(float);
      bytes += workspace_slice_bytes(size);
      return slicer ? static_cast<float*>(slicer->take_bytes(size, what)) : nullptr;
    };
    struct {
      float *scratch, *pixels, *patch_rows, *embedded, *hidden, *normed, *qkv, *attended, *projected, *mlp;
    } s{};
    s.scratch = take(static_cast<int64_t>(CublasLtGemm::kWorkspaceBytes / sizeof(float)), "GEMM scratch");
    s.pixels = take(pixel_count, "pixels");
    s.patch_rows = take(batch * patches * patch_values, "patch rows");
    s.embedded = take(batch * patches * hidden, "patch embeddings");
    s.hidden = take(rows * hidden, "residual stream");
    s.normed = take(rows * hidden, "normed");
    s.qkv = take(rows * 3 * hidden, "q, k, v");
    s.attended = take(rows * hidden, "attention output");
    s.projected = take(rows * hidden, "projection");
    s.mlp = take(rows * c.intermediate_size, "MLP");
    return std::make_pair(s, bytes);
  };
  workspace.reserve(slices(nullptr).second);
  WorkspaceSlicer slicer(workspace);
  const auto a = slices(&slicer).first;
  const auto eps = static_cast<float>(c.layer_norm_eps);
  const auto data = [](const Tensor& t) { return t.data_as<const float>(); };

  check_cuda(cudaMemcpyAsync(a.pixels, pixels, static_cast<size_t>(pixel_count) * sizeof(float), cudaMemcpyHostToDevice, stream),
             "pixels upload");
  launch_clip_patch_rows(a.pixels, a.patch_rows, batch, c.num_channels, side, c.patch_size, stream);
  linear(patch_embedding_, a.patch_rows, batch * patches, a.embedded, a.scratch, stream);
  launch_clip_embed(a.embedded, data(class_embedding_), data(position_embedding_), a.hidden, batch, tokens, hidden, stream);
  launch_clip_layer_norm(a.hidden, data(pre_norm_weight_), data(pre_norm_bias_), a.hidden, rows, hidden, eps, stream);
  // Scale 1/sqrt(head_dim), no mask: transformers' CLIPAttention on pixel inputs.
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (const Layer& layer : layers_) {
    launch_clip_layer_norm(a.hidden, data(layer.norm1_weight), data(layer.norm1_bias), a.normed, rows, hidden, eps, stream);
    linear(layer.qkv, a.normed, rows, a.qkv, a.scratch, stream);
    launch_clip_attention(a.qkv, 3 * hidden, a.attended, batch, tokens, heads, head_dim, scale, stream);
    linear(layer.out, a.attended, rows, a.projected, a.scratch, stream);
    launch_add_into(a.hidden, a.projected, rows * hidden, stream);

    launch_clip_layer_norm(a.hidden, data(layer.norm2_weight), data(layer.norm2_bias), a.normed, rows, hidden, eps, stream);
    linear(layer.fc1, a.normed, rows, a.mlp, a.scratch, stream);
    launch_clip_activation(a.mlp, rows * c.intermediate_size, c.hidden_act == ClipActivation::quick_gelu, stream);
    linear(layer.fc2, a.mlp, rows, a.projected, a.scratch, stream);
    launch_add_into(a.hidden, a.projected, rows * hidden, stream);
  }
  tessel::cuda::check_launch("CLIP vision CUDA forward");
  check_cuda(cudaMemcpyAsync(out, a.hidden, static_cast<size_t>(rows * hidden) * sizeof(float), cudaMemcpyDeviceToHost, stream),
             "output download");
  check_cuda(cudaStreamSynchronize(stream), "synchronization");
}

}  // namespace tessel::diffusion::cuda
