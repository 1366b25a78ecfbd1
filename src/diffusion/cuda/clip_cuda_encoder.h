// The CLIP vision encoder's forward on one CUDA device (internal; ClipVisionEncoder owns one when it
// is built for a CUDA device). The same operations as the CPU forward (clip_vision_encoder.h), all
// in fp32 as diffusers runs Wan 2.1 I2V's image encoder:
//   - the weights fp32 on the device (ViT-H/14's 31 layers that hidden_states[-2] needs: 2.5 GB),
//     q, k and v fused into one projection;
//   - the linears (the patch embedding's convolution as a GEMM over the patches' rows) through
//     cuBLASLt in fp32 without TF32, the bias in the epilogue;
//   - LayerNorm, GELU / quick_gelu and the residual adds as fp32 kernels;
//   - attention in fp32 (clip_kernels.h: head dim up to 128; ViT-H's is 80).
// bf16 weights would halve the memory and speed the GEMMs, but move the features by about 1e-2
// relative where diffusers' fp32 encoder is the reference; the encoder runs once per request
// (about 0.3 TFLOP per image at ViT-H), a few milliseconds even in fp32.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/diffusion/clip_vision_encoder.h"
#include "tessel/kernels/cuda/cublaslt_gemm.h"

namespace tessel::diffusion::cuda {

class ClipCudaEncoder {
 public:
  // `weights`: the tensors of clip_vision_weight_specs(config) (names and shapes checked by the
  // caller), any float dtype, on the host; uploaded one at a time as fp32. Throws Error naming the
  // head dim when it is past the attention kernel's kMaxClipHeadDim.
  ClipCudaEncoder(const ClipVisionConfig& config, const std::map<std::string, Tensor>& weights, Device device);
  ClipCudaEncoder(const ClipCudaEncoder&) = delete;
  ClipCudaEncoder& operator=(const ClipCudaEncoder&) = delete;

  // pixels (batch, channels, image_size, image_size) and out (batch, tokens, hidden_size): fp32 host
  // memory, checked by the caller. Runs on ctx.stream (when ctx is on this device) and waits for it.
  void forward(const ExecContext& ctx, const float* pixels, int64_t batch, float* out) const;

 private:
  struct Linear {
    Tensor weight, bias;  // (out, in) as PyTorch stores it; bias (out) or undefined
  };
  struct Layer {
    Tensor norm1_weight, norm1_bias, norm2_weight, norm2_bias;
    Linear qkv, out, fc1, fc2;
  };
  void linear(const Linear& layer, const float* x, int64_t rows, float* y, void* scratch, cudaStream_t stream) const;

  ClipVisionConfig config_;
  Device device_;
  Linear patch_embedding_;
  Tensor class_embedding_, position_embedding_, pre_norm_weight_, pre_norm_bias_;
  std::vector<Layer> layers_;  // the first num_hidden_layers - 1
  tessel::cuda::CublasLtGemm gemm_;
};

}  // namespace tessel::diffusion::cuda
