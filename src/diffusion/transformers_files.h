// The files of a transformers model directory (save_pretrained's layout), shared by the encoders
// that read one: the UMT5 text encoder and the CLIP vision encoder.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessel::diffusion {

// The most bytes a config.json or safetensors index may hold.
inline constexpr uint64_t kMaxTransformersJsonBytes = 16 << 20;

// The safetensors files holding the weights, as names in `directory`: model.safetensors, or each
// shard model.safetensors.index.json names, once, in the index's order. `what` names the model in
// errors ("text encoder"). Throws Error naming the index and the entry when a shard is not a plain
// file name.
std::vector<std::string> transformers_weight_files(const std::string& directory, const std::string& what);

}  // namespace tessel::diffusion
