// Random-weight checkpoints at full model sizes, streamed to disk (internal to the model writers):
// each tensor is drawn a chunk at a time from a counter-based stream and written straight after,
// so memory stays at one chunk whatever the model's size, and the draw runs on every thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tessel/core/dtype.h"
#include "tessel/dit/checkpoint.h"

namespace tessel {

// How one tensor's values are drawn: uniform in [first, second), or normal(mean first, stddev second).
struct RandomTensorInit {
  bool normal = false;
  double first = 0.0, second = 0.0;
};

struct RandomTensorSpec {
  WeightSpec spec;
  RandomTensorInit init;
};

// Where a checkpoint goes: `single_file` when it fits in one shard, otherwise shards named
// `<stem>-00001-of-0000N.safetensors` and `index_file` ({"metadata": {"total_size"}, "weight_map"}),
// as diffusers and transformers save them.
struct CheckpointFiles {
  std::filesystem::path directory;
  std::string single_file;  // e.g. "diffusion_pytorch_model.safetensors"
  std::string index_file;   // e.g. "diffusion_pytorch_model.safetensors.index.json"
  uint64_t max_shard_bytes = uint64_t{5} << 30;
};

// Writes `tensors` in `dtype` (fp32 or bf16; bf16 rounds to nearest even), tensor i drawn from the
// stream of (seed, i). Returns the bytes of tensor data written. Throws Error naming a file it
// cannot write. threads <= 0: every core.
uint64_t write_random_checkpoint(const CheckpointFiles& files, const std::vector<RandomTensorSpec>& tensors, DType dtype,
                                 uint64_t seed, int threads);

}  // namespace tessel
