// The tensors of a diffusers WanTransformer3DModel checkpoint (text-to-video, with Wan 2.1 I2V /
// FLF2V's image branch when the config has one), by name and shape, for a given config — what
// load_weights checks a checkpoint directory against. Linear weights are
// (out_features, in_features) as PyTorch stores them; the patch embedding is the Conv3d kernel
// (inner_dim, in_channels, patch_t, patch_h, patch_w).
#pragma once

#include <string>
#include <vector>

#include "tessel/dit/checkpoint.h"
#include "tessel/dit/wan_config.h"

namespace tessel {

std::vector<WeightSpec> wan_weight_specs(const WanConfig& config);

// The element type a tensor is kept in by a CUDA model: bf16 for the linear layers of the blocks,
// the patch embedding, the text embedder and the output projection; fp32 for the time embedder
// and time projection, the modulation tables, the norm weights, and the biases of the GEMMs that
// write fp32 (patch embedding into the residual stream, output projection, the image embedder's
// two linears) and the image embedder's FLF2V position table.
DType wan_cuda_weight_dtype(const std::string& tensor_name);

// Whether WanWeightPrecision::kFp8 keeps a tensor in e4m3: the weight matrices of the blocks'
// linear layers (self- and cross-attention q/k/v/out, the FFN). The image branch's add_k_proj /
// add_v_proj stay bf16: they read a few hundred image tokens once per block, nothing an FP8 GEMM
// would gain on, through the bf16 path the branch shares.
bool wan_fp8_weight(const std::string& tensor_name);

// How random weights for benchmarks are drawn, at the scale of diffusers' initialization: uniform
// in +-1/sqrt(fan_in) for the linear and Conv3d weights (PyTorch's default), ones for norm weights,
// normal(0, 1/sqrt(dim)) for the modulation tables, uniform in +-0.01 for biases.
struct WanRandomInit {
  bool normal = false;
  double first = 0.0, second = 0.0;  // uniform: low, high; normal: mean, standard deviation
};
WanRandomInit wan_random_init(const WanConfig& config, const WeightSpec& spec);

// "blocks.<layer>.<name>", the checkpoint prefix of one transformer block's tensors.
std::string wan_block_tensor(int64_t layer, const std::string& name);

}  // namespace tessel
