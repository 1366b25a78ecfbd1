// A model checkpoint directory as diffusers' save_pretrained writes it: either one
// `diffusion_pytorch_model.safetensors`, or shards named by
// `diffusion_pytorch_model.safetensors.index.json` ({"metadata": {...}, "weight_map":
// {"tensor name": "shard file name", ...}}). Shards are memory-mapped, so opening a 14B checkpoint
// reads only headers; tensors are converted to the compute dtype once, by load_weights.
//
// Every check happens before any tensor is converted: a malformed index, a shard that is missing
// or is not plain file name in the directory, a tensor the index names but its shard lacks,
// a tensor the model expects but the checkpoint lacks, a tensor the checkpoint has but the model
// does not expect, and a shape that differs from the expected one each give an Error naming the
// tensor (and both shapes for a mismatch).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/core/io/safetensors.h"
#include "tessel/core/tensor.h"

namespace tessel {

inline constexpr const char* kDiffusersWeightsFile = "diffusion_pytorch_model.safetensors";
inline constexpr const char* kDiffusersWeightsIndex = "diffusion_pytorch_model.safetensors.index.json";

// One tensor a model expects: its checkpoint name and shape.
struct WeightSpec {
  std::string name;
  Shape shape;
};

class Checkpoint {
 public:
  // Opens the index (or the single file) of `directory` and maps every shard it names.
  static Checkpoint open(const std::string& directory);
  // Maps one safetensors file (a single-file checkpoint); directory() is then the file's path.
  static Checkpoint open_file(const std::string& path);

  const std::string& directory() const { return directory_; }
  // Every tensor of the checkpoint, by name.
  std::vector<std::string> tensor_names() const;
  // Null when the checkpoint has no tensor of that name.
  const SafetensorsEntry* find(const std::string& name) const;
  // The tensor's bytes in the mapped shard, in its stored dtype. Throws Error when absent.
  TensorView view(const std::string& name) const;

 private:
  struct MappedShard;
  struct Location {
    std::shared_ptr<const MappedShard> shard;
    const SafetensorsEntry* entry = nullptr;
  };
  std::string directory_;
  std::map<std::string, Location> tensors_;
};

// Loads exactly the tensors of `expected` from `checkpoint`, each converted to `dtype` into a new
// CPU tensor (stored bf16, fp16 or fp32 are accepted). Throws Error, before converting anything,
// when an expected tensor is missing, has another shape, or the checkpoint holds a tensor that
// is not expected.
// Throws Error, naming the tensor, when an expected tensor is missing, has another shape or a
// stored dtype other than fp32, fp16 or bf16, or the checkpoint holds a tensor that is not
// expected. Reads headers only (for loaders that then take the tensors one at a time).
void check_checkpoint(const Checkpoint& checkpoint, const std::vector<WeightSpec>& expected);

std::map<std::string, Tensor> load_weights(const Checkpoint& checkpoint, const std::vector<WeightSpec>& expected,
                                           DType dtype);
// load_weights' conversion alone, of `specs` (a subset of a checkpoint check_checkpoint accepted:
// e.g. the decoder's half of a VAE). Non-finite values are an Error naming the tensor.
std::map<std::string, Tensor> read_weights(const Checkpoint& checkpoint, const std::vector<WeightSpec>& specs, DType dtype);

}  // namespace tessel
