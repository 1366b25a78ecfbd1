// A safetensors reader and writer (format: 8-byte little-endian header length N, N bytes of JSON
// header {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"k": "v"}}, then the raw little-endian data; offsets are relative to the data
// start). open() validates the whole header against the file before any tensor is read: file
// shorter than 8 bytes, header longer than the file, malformed JSON, unknown or unsupported
// dtypes, negative shapes, offsets past the data or overlapping another tensor, and byte spans
// that differ from shape × dtype size each give an Error naming the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
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
};

class SafetensorsFile {
 public:
  // Reads and validates the header. Supported dtypes: F32, F16, BF16, F64, I32, U8.
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

// Writes CPU views (any strides) in the order given. Throws Error on duplicate names, names that
// start with "__", non-CPU views, or I/O failure.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// The bytes write_safetensors writes, in memory (same checks).
std::string safetensors_bytes(const std::vector<std::pair<std::string, TensorView>>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace tessel
