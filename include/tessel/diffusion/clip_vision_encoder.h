// The CLIP vision encoder Wan 2.1 I2V conditions on (diffusers' WanImageToVideoPipeline.encode_image:
// transformers' CLIPVisionModel, open-clip ViT-H/14 in Wan's checkpoints), returning what the
// pipeline takes: hidden_states[-2], the output of the penultimate encoder layer.
//   patch embedding (a convolution with stride patch_size, no bias) -> the class embedding before
//   the patches -> + position embedding -> pre_layrnorm -> per layer: x + out_proj(attention(
//   layer_norm1(x))), then x + fc2(act(fc1(layer_norm2(x)))).
// The last layer and post_layernorm do not contribute to hidden_states[-2] and are not computed.
// fp32 everywhere, as diffusers runs Wan 2.1 I2V's image encoder: on the CPU the linears are
// dit::linear's GEMM and the attention the kernels' CPU dense attention; on a CUDA device the
// linears are cuBLASLt fp32 GEMMs (no TF32) and the attention an fp32 kernel of its own.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/dit/checkpoint.h"

namespace tessel {

namespace diffusion::cuda {
class ClipCudaEncoder;
}

// transformers' ACT2FN names the encoder's MLP accepts: "gelu" (exact, erf) and "quick_gelu"
// (x * sigmoid(1.702 x), OpenAI's CLIP).
enum class ClipActivation { gelu, quick_gelu };

// transformers' CLIPVisionConfig; the defaults are its defaults (save_pretrained writes only the
// fields that differ from them). Wan 2.1's encoder: hidden 1280, intermediate 5120, 32 layers,
// 16 heads, patch 14, image 224, gelu.
struct ClipVisionConfig {
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t num_channels = 3;
  int64_t image_size = 224;
  int64_t patch_size = 32;
  ClipActivation hidden_act = ClipActivation::quick_gelu;
  double layer_norm_eps = 1e-5;

  // 1 + (image_size / patch_size)^2: the class token and the patches.
  int64_t tokens() const;
  // Throws Error naming the field when a value is out of range (image_size must be a multiple of
  // patch_size, hidden_size of num_attention_heads).
  void validate() const;
};

// Parses transformers' config.json of a CLIPVisionModel (a diffusers Wan I2V directory's
// image_encoder/config.json), or of a CLIPModel, whose vision_config it reads. hidden_act must be
// "gelu" or "quick_gelu". Throws Error naming the field.
ClipVisionConfig parse_clip_vision_config(std::string_view json_text, const std::string& source = "config.json");

// Every tensor of a CLIPVisionModel checkpoint under transformers' names before version 5 (Wan's
// checkpoints: vision_model.embeddings.patch_embedding.weight, ...class_embedding,
// ...position_embedding.weight, vision_model.pre_layrnorm.{weight,bias},
// vision_model.encoder.layers.<i>.{self_attn.{q,k,v,out}_proj,layer_norm1,layer_norm2,mlp.fc1,
// mlp.fc2}.{weight,bias}, vision_model.post_layernorm.{weight,bias}), the last layer and
// post_layernorm included, so that a checkpoint written from these specs loads in transformers.
std::vector<WeightSpec> clip_vision_weight_specs(const ClipVisionConfig& config);

// An encoder lives on one device, chosen at construction: the CPU, or a CUDA device (builds with
// CUDA), where its weights stay in fp32 (ViT-H/14: 2.5 GB). Pixels in and features out are host
// tensors either way.
class ClipVisionEncoder {
 public:
  // `weights` holds exactly the tensors of clip_vision_weight_specs(config), any float dtype.
  // Throws Error naming a missing, extra or misshapen tensor, or a CUDA device in a build without
  // CUDA. Only the tensors forward reads are kept (fp32; on the CPU the linears transposed for the
  // GEMM).
  ClipVisionEncoder(ClipVisionConfig config, const std::map<std::string, Tensor>& weights, Device device = Device::cpu());

  // Reads a transformers model directory (a diffusers Wan I2V pipeline's image_encoder/):
  // config.json and model.safetensors, or the shards model.safetensors.index.json names. Tensor
  // names may carry the "vision_model." prefix or not (transformers 5 saves them without);
  // embeddings.position_ids, a buffer older versions saved, is skipped. Throws Error naming a
  // missing file or tensor.
  static ClipVisionEncoder load(const std::string& directory, Device device = Device::cpu());

  // pixel_values (B, num_channels, image_size, image_size) fp32 CPU contiguous (preprocessed:
  // clip_image_processor.h); out (B, tokens(), hidden_size) fp32 CPU contiguous receives
  // hidden_states[-2]. Throws Error naming a bad argument. A CUDA encoder runs on ctx.stream when
  // ctx is on its device (else its device's default stream) and returns when out is written.
  void forward(const ExecContext& ctx, const TensorView& pixel_values, const TensorView& out) const;

  const ClipVisionConfig& config() const { return config_; }
  Device device() const { return device_; }

 private:
  // A Linear layer as dit::linear takes it: the weight transposed to (in, out), fp32.
  struct Linear {
    Tensor weight_t, bias;
    void operator()(const ExecContext& ctx, const float* x, int64_t rows, float* y) const;
  };
  struct Layer {
    Tensor norm1_weight, norm1_bias, norm2_weight, norm2_bias;
    Linear q, k, v, out, fc1, fc2;
  };
  ClipVisionConfig config_;
  Device device_;
  std::shared_ptr<const diffusion::cuda::ClipCudaEncoder> cuda_;  // CUDA encoders; the CPU's fields below stay empty
  Linear patch_embedding_;  // (channels * patch * patch, hidden), no bias
  Tensor class_embedding_, position_embedding_, pre_norm_weight_, pre_norm_bias_;
  std::vector<Layer> layers_;  // the first num_hidden_layers - 1
};

}  // namespace tessel
