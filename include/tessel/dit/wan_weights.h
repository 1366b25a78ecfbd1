// The tensors of a diffusers WanTransformer3DModel checkpoint (text-to-video), by name and shape,
// for a given config — what load_weights checks a checkpoint directory against. Linear weights are
// (out_features, in_features) as PyTorch stores them; the patch embedding is the Conv3d kernel
// (inner_dim, in_channels, patch_t, patch_h, patch_w).
#pragma once

#include <string>
#include <vector>

#include "tessel/dit/checkpoint.h"
#include "tessel/dit/wan_config.h"

namespace tessel {

std::vector<WeightSpec> wan_weight_specs(const WanConfig& config);

// "blocks.<layer>.<name>", the checkpoint prefix of one transformer block's tensors.
std::string wan_block_tensor(int64_t layer, const std::string& name);

}  // namespace tessel
