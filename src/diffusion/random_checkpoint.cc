#include "random_checkpoint.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numbers>

#include "tessel/core/error.h"
#include "tessel/core/parallel.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

// Elements drawn and written per chunk: bounds the memory of a write (256 MiB in fp32).
constexpr int64_t kChunkElements = int64_t{1} << 26;
// Paths in messages are quoted whole up to this length.
constexpr size_t kMaxPathText = 1024;
// Elements per parallel task within a chunk.
constexpr int64_t kTaskElements = int64_t{1} << 18;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element `index` of the stream `stream`: a value of the init's distribution (Box-Muller on the two
// 24-bit halves of one hash for the normal one).
float draw(const RandomTensorInit& init, uint64_t stream, uint64_t index) {
  const uint64_t bits = splitmix64(stream ^ splitmix64(index));
  constexpr double kUnit = 1.0 / double(1 << 24);
  const double u1 = static_cast<double>(bits >> 40) * kUnit, u2 = static_cast<double>((bits >> 8) & 0xffffff) * kUnit;
  if (!init.normal) return static_cast<float>(init.first + (init.second - init.first) * u1);
  const double radius = std::sqrt(-2.0 * std::log(1.0 - u1));  // 1 - u1 in (0, 1]
  return static_cast<float>(init.first + init.second * radius * std::cos(2.0 * std::numbers::pi * u2));
}

class FileSink {
 public:
  explicit FileSink(const fs::path& path) : path_(path), file_(std::fopen(path.c_str(), "wb")) {
    if (file_ == nullptr) fail_argument("directory", "a writable directory", "cannot create " + quoted_excerpt(path.string(), kMaxPathText));
  }
  ~FileSink() {
    if (file_) std::fclose(file_);
  }
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;
  void write(const void* data, size_t bytes) {
    if (std::fwrite(data, 1, bytes, file_) != bytes)
      throw Error(detail::concat("cannot write ", quoted_excerpt(path_.string(), kMaxPathText), " (disk full?)"));
  }
  void close() {
    const int status = std::fclose(file_);
    file_ = nullptr;
    if (status != 0) throw Error(detail::concat("cannot write ", quoted_excerpt(path_.string(), kMaxPathText), " (disk full?)"));
  }

 private:
  fs::path path_;
  FILE* file_;
};

struct Shard {
  std::vector<size_t> tensors;  // indices into the tensor list
  uint64_t bytes = 0;
};

// The safetensors header of a shard: each tensor's dtype, shape and byte range, padded with spaces
// to a multiple of 8 bytes as the format asks.
std::string shard_header(const std::vector<RandomTensorSpec>& tensors, const Shard& shard, DType dtype) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (size_t i : shard.tensors) {
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(tensors[i].spec.shape)) * dtype_size(dtype);
    header[tensors[i].spec.name] = {{"dtype", dtype == DType::kBF16 ? "BF16" : "F32"},
                                    {"shape", tensors[i].spec.shape},
                                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  return text;
}

void write_shard(const fs::path& path, const std::vector<RandomTensorSpec>& tensors, const Shard& shard, DType dtype, uint64_t seed,
                 int threads) {
  FileSink sink(path);
  const std::string header = shard_header(tensors, shard, dtype);
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>((header.size() >> (8 * i)) & 0xff);
  sink.write(length, 8);
  sink.write(header.data(), header.size());
  const size_t element_bytes = dtype_size(dtype);
  std::vector<unsigned char> chunk(static_cast<size_t>(kChunkElements) * element_bytes);
  for (size_t t : shard.tensors) {
    const RandomTensorSpec& tensor = tensors[t];
    const uint64_t stream = splitmix64(seed * 0x100000001b3ull + t);
    const int64_t count = shape_numel(tensor.spec.shape);
    for (int64_t start = 0; start < count; start += kChunkElements) {
      const int64_t n = std::min(kChunkElements, count - start);
      parallel_for(threads, (n + kTaskElements - 1) / kTaskElements, [&](int64_t task, int) {
        const int64_t begin = task * kTaskElements, end = std::min(n, begin + kTaskElements);
        for (int64_t i = begin; i < end; ++i) {
          const float value = draw(tensor.init, stream, static_cast<uint64_t>(start + i));
          if (dtype == DType::kBF16)
            reinterpret_cast<uint16_t*>(chunk.data())[i] = float_to_bf16(value);
          else
            reinterpret_cast<float*>(chunk.data())[i] = value;
        }
      });
      sink.write(chunk.data(), static_cast<size_t>(n) * element_bytes);
    }
  }
  sink.close();
}

}  // namespace

uint64_t write_random_checkpoint(const CheckpointFiles& files, const std::vector<RandomTensorSpec>& tensors, DType dtype,
                                 uint64_t seed, int threads) {
  if (dtype != DType::kBF16 && dtype != DType::kF32) fail_argument("checkpoint dtype", "bf16 or fp32", dtype_name(dtype));
  // Tensors go to shards in order; a shard closes before the tensor that would take it past the limit.
  std::vector<Shard> shards(1);
  uint64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(tensors[i].spec.shape)) * dtype_size(dtype);
    if (!shards.back().tensors.empty() && shards.back().bytes + bytes > files.max_shard_bytes) shards.emplace_back();
    shards.back().tensors.push_back(i);
    shards.back().bytes += bytes;
    total += bytes;
  }
  if (shards.size() == 1) {
    write_shard(files.directory / files.single_file, tensors, shards[0], dtype, seed, threads);
    return total;
  }
  // "model.safetensors" -> "model-00001-of-00005.safetensors", as save_pretrained names shards.
  const std::string stem = files.single_file.substr(0, files.single_file.rfind(".safetensors"));
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    const std::string file = stem + name;
    write_shard(files.directory / file, tensors, shards[s], dtype, seed, threads);
    for (size_t i : shards[s].tensors) weight_map[tensors[i].spec.name] = file;
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream out(files.directory / files.index_file, std::ios::trunc);
  out << index.dump(2) << "\n";
  out.close();
  if (!out) throw Error(detail::concat("cannot write ", quoted_excerpt((files.directory / files.index_file).string(), kMaxPathText)));
  return total;
}

}  // namespace tessel
