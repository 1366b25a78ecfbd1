// A safetensors reader and writer (format: 8-byte little-endian header length N, N bytes of JSON
// header {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"k": "v"}}, then the raw little-endian data; offsets are relative to the data
// start). F8_E4M3 (float8 e4m3fn, FP8 checkpoints) is read as DType::kU8 bytes marked
// float8_e4m3 (tessel/core/float8.h converts them). open() validates the whole header against the file before any tensor is read: file
// shorter than 8 bytes, header longer than the file, malformed JSON, unknown or unsupported
// dtypes, negative shapes, offsets past the data or overlapping another tensor, and byte spans
// that differ from shape × dtype size each give an Error naming the file and the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tessel/core/tensor.h"

namespace tessel {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the data section
  uint64_t end = 0;
  // "F8_E4M3": the bytes are float8 e4m3fn values (dtype kU8), not integers.
  bool float8_e4m3 = false;
};

class SafetensorsFile {
 public:
  // Reads and validates the header. Supported dtypes: F32, F16, BF16, F64, I32, U8, F8_E4M3.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Byte offset of the data section in the file: an entry's bytes are at data_offset() + begin
  // (for readers that memory-map the file instead of calling load()).
  uint64_t data_offset() const { return data_offset_; }
  // Null when absent.
  const SafetensorsEntry* find(const std::string& name) const;
  // Reads one tensor into a new CPU tensor of its dtype. Throws Error if absent or unreadable.
  Tensor load(const std::string& name) const;

 private:
  std::string path_;
  uint64_t data_offset_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes CPU views (any strides) in the order given; the kU8 tensors named in `float8_e4m3` as
// F8_E4M3. Throws Error on duplicate names, names that start with "__", non-CPU views, a float8
// name that is not a kU8 tensor, or I/O failure.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata = {}, const std::set<std::string>& float8_e4m3 = {});
// The bytes write_safetensors writes, in memory (same checks).
std::string safetensors_bytes(const std::vector<std::pair<std::string, TensorView>>& tensors,
                              const std::map<std::string, std::string>& metadata = {}, const std::set<std::string>& float8_e4m3 = {});
// Writes a file too large to hold in memory: the header from `entries` (name, dtype, shape,
// float8_e4m3; offsets are assigned here in order), then each tensor as `produce(i)` returns it (a
// contiguous CPU view of entry i's dtype and shape, used before the next call). Same name checks.
void write_safetensors_streamed(const std::string& path, std::vector<SafetensorsEntry> entries,
                                const std::map<std::string, std::string>& metadata,
                                const std::function<TensorView(size_t index)>& produce);

}  // namespace tessel
