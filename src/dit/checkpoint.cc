#include "tessel/dit/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "tessel/core/error.h"
#include "tessel/core/finite_check.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/limited_json.h"

namespace tessel {

// A shard's validated header and its read-only mapping; unmapped when the last tensor view's
// owner (the Checkpoint) goes.
struct Checkpoint::MappedShard {
  SafetensorsFile file;
  const std::byte* bytes = nullptr;
  size_t size = 0;

  explicit MappedShard(const std::string& path) : file(SafetensorsFile::open(path)) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) fail_argument("checkpoint shard", "a readable file", path);
    struct stat info {};
    if (::fstat(fd, &info) != 0) {
      ::close(fd);
      fail_argument("checkpoint shard", "a file whose size can be read", path);
    }
    size = static_cast<size_t>(info.st_size);
    uint64_t needed = file.data_offset();
    for (const SafetensorsEntry& entry : file.entries()) needed = std::max(needed, file.data_offset() + entry.end);
    if (size < needed) {
      ::close(fd);
      throw Error(detail::concat(path, ": ", size, " bytes, but its header describes ", needed, " (file changed while opening?)"));
    }
    void* mapped = size == 0 ? nullptr : ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (mapped == MAP_FAILED) throw Error(path + ": cannot memory-map the file");
    bytes = static_cast<const std::byte*>(mapped);
  }
  ~MappedShard() {
    if (bytes != nullptr) ::munmap(const_cast<std::byte*>(bytes), size);
  }
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;
};

namespace {

constexpr uint64_t kMaxIndexBytes = 64ull << 20;

// The index's weight_map: tensor name -> shard file name. Shard names must be plain file names
// (no folder part), so an index cannot point outside its directory.
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  const std::string where = index_path;
  const nlohmann::json index =
      parse_json_limited(read_file_bounded(index_path, kMaxIndexBytes, "checkpoint index"), JsonLimits{kMaxIndexBytes, 8}, where);
  if (!index.is_object() || !index.contains("weight_map"))
    fail_argument(where, "an object with a \"weight_map\" key", json_excerpt(index));
  const nlohmann::json& weight_map = index["weight_map"];
  if (!weight_map.is_object()) fail_argument(where + ": weight_map", "an object of tensor name -> shard file", json_excerpt(weight_map));
  std::map<std::string, std::string> out;
  for (const auto& [tensor, shard] : weight_map.items()) {
    const std::string entry = where + ": weight_map[" + quoted_excerpt(tensor) + "]";
    if (!shard.is_string()) fail_argument(entry, "a shard file name (string)", json_excerpt(shard));
    const std::string name = shard.get<std::string>();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos || name.find('\0') != std::string::npos)
      fail_argument(entry, "a file name in the checkpoint directory (no folder part)", quoted_excerpt(name));
    out.emplace(tensor, name);
  }
  if (out.empty()) fail_argument(where + ": weight_map", "at least one tensor", "an empty map");
  return out;
}

// A stored (contiguous, mapped) tensor converted to fp32 in one pass; the common case of loading,
// without copy_convert's general strided indexing.
void convert_to_f32(const TensorView& stored, float* out) {
  const int64_t count = stored.numel();
  switch (stored.dtype()) {
    case DType::kF32:
      std::memcpy(out, stored.data(), static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_float(stored.data_as<const uint16_t>()[i]);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < count; ++i) out[i] = half_to_float(stored.data_as<const uint16_t>()[i]);
      return;
    default:
      throw Error(detail::concat("convert_to_f32: stored dtype ", dtype_name(stored.dtype()), ", expected fp32, fp16 or bf16"));
  }
}

std::string list_names(const std::vector<std::string>& names, size_t max_listed = 8) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < max_listed; ++i) out += (i ? ", " : "") + quoted_excerpt(names[i], 120);
  if (names.size() > max_listed) out += detail::concat(" and ", names.size() - max_listed, " more");
  return out;
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& directory) {
  if (!std::filesystem::is_directory(directory)) fail_argument("checkpoint directory", "an existing directory", quoted_excerpt(directory, 200));
  Checkpoint checkpoint;
  checkpoint.directory_ = directory;
  const std::string index_path = directory + "/" + kDiffusersWeightsIndex;
  const std::string single_path = directory + "/" + kDiffusersWeightsFile;
  if (std::filesystem::exists(index_path)) {
    std::map<std::string, std::shared_ptr<const MappedShard>> shards;
    for (const auto& [tensor, shard_name] : read_weight_map(index_path)) {
      auto& shard = shards[shard_name];
      if (!shard) {
        const std::string shard_path = directory + "/" + shard_name;
        if (!std::filesystem::exists(shard_path))
          throw Error(detail::concat(index_path, ": tensor ", quoted_excerpt(tensor, 120), " is in shard ", quoted_excerpt(shard_name),
                                     ", which does not exist in ", directory));
        shard = std::make_shared<const MappedShard>(shard_path);
      }
      const SafetensorsEntry* entry = shard->file.find(tensor);
      if (entry == nullptr)
        throw Error(detail::concat(index_path, ": tensor ", quoted_excerpt(tensor, 120), " is indexed in shard ",
                                   quoted_excerpt(shard_name), ", which does not hold it"));
      checkpoint.tensors_[tensor] = Location{shard, entry};
    }
  } else if (std::filesystem::exists(single_path)) {
    auto shard = std::make_shared<const MappedShard>(single_path);
    for (const SafetensorsEntry& entry : shard->file.entries()) checkpoint.tensors_[entry.name] = Location{shard, &entry};
  } else {
    throw Error(detail::concat("checkpoint directory ", quoted_excerpt(directory, 200), ": expected ", kDiffusersWeightsIndex,
                               " or ", kDiffusersWeightsFile, " in it, found neither"));
  }
  return checkpoint;
}

Checkpoint Checkpoint::open_file(const std::string& path) {
  require_regular_file(path, "checkpoint file");
  Checkpoint checkpoint;
  checkpoint.directory_ = path;
  auto shard = std::make_shared<const MappedShard>(path);
  for (const SafetensorsEntry& entry : shard->file.entries()) checkpoint.tensors_[entry.name] = Location{shard, &entry};
  return checkpoint;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, location] : tensors_) names.push_back(name);
  return names;
}

const SafetensorsEntry* Checkpoint::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.entry;
}

TensorView Checkpoint::view(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Error(detail::concat("checkpoint ", directory_, ": no tensor ", quoted_excerpt(name, 120)));
  const Location& location = it->second;
  const std::byte* data = location.shard->bytes + location.shard->file.data_offset() + location.entry->begin;
  return TensorView(const_cast<std::byte*>(data), location.entry->dtype, Device::cpu(), location.entry->shape);
}

void check_checkpoint(const Checkpoint& checkpoint, const std::vector<WeightSpec>& expected) {
  const std::string where = "checkpoint " + checkpoint.directory();
  std::set<std::string> expected_names;
  std::vector<std::string> missing;
  for (const WeightSpec& spec : expected) {
    if (!expected_names.insert(spec.name).second) throw Error("load_weights: tensor " + quoted_excerpt(spec.name, 120) + " expected twice");
    const SafetensorsEntry* entry = checkpoint.find(spec.name);
    if (entry == nullptr) {
      missing.push_back(spec.name);
      continue;
    }
    if (entry->shape != spec.shape)
      throw Error(detail::concat(where, ": tensor ", quoted_excerpt(spec.name, 120), " has shape ", shape_str(entry->shape),
                                 ", the model expects ", shape_str(spec.shape)));
    if (entry->float8_e4m3)
      throw Error(detail::concat(where, ": tensor ", quoted_excerpt(spec.name, 120),
                                 " is stored as float8 e4m3 (an FP8 checkpoint: give it as a transformer file, "
                                 "WanTransformer::load's weights_file), expected fp32, fp16 or bf16"));
    if (entry->dtype != DType::kF32 && entry->dtype != DType::kF16 && entry->dtype != DType::kBF16)
      throw Error(detail::concat(where, ": tensor ", quoted_excerpt(spec.name, 120), " is stored as ", dtype_name(entry->dtype),
                                 ", expected fp32, fp16 or bf16"));
  }
  if (!missing.empty())
    throw Error(detail::concat(where, ": missing ", missing.size(), " tensor(s) the model needs: ", list_names(missing)));
  std::vector<std::string> unexpected;
  for (const std::string& name : checkpoint.tensor_names())
    if (!expected_names.count(name)) unexpected.push_back(name);
  if (!unexpected.empty())
    throw Error(detail::concat(where, ": ", unexpected.size(), " unexpected tensor(s) the model does not have: ", list_names(unexpected),
                               " (a checkpoint of another model or configuration?)"));
}

std::map<std::string, Tensor> load_weights(const Checkpoint& checkpoint, const std::vector<WeightSpec>& expected, DType dtype) {
  check_checkpoint(checkpoint, expected);
  return read_weights(checkpoint, expected, dtype);
}

std::map<std::string, Tensor> read_weights(const Checkpoint& checkpoint, const std::vector<WeightSpec>& specs, DType dtype) {
  if (!is_floating(dtype) || dtype == DType::kF64) fail_argument("load_weights dtype", "fp32, fp16 or bf16", dtype_name(dtype));
  const std::vector<WeightSpec>& expected = specs;
  std::map<std::string, Tensor> weights;
  for (const WeightSpec& spec : expected) {
    Tensor converted = Tensor::empty(spec.shape, dtype);
    const TensorView stored = checkpoint.view(spec.name);
    if (dtype == DType::kF32)
      convert_to_f32(stored, converted.data_as<float>());
    else
      copy_convert(stored, converted.view());
    // NaN or infinity in a weight would surface steps later as a black or noisy video: refuse it
    // here, naming the file and the tensor (the check counts exponent bits over the cores).
    check_finite(converted, checkpoint.directory() + ": tensor \"" + spec.name + "\"", "the checkpoint is damaged or was saved with overflowed values");
    weights.emplace(spec.name, std::move(converted));
  }
  return weights;
}

}  // namespace tessel
