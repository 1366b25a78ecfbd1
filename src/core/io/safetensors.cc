#include "tessel/core/io/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/limited_json.h"

namespace tessel {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit
// A header is a flat object of tensor entries ({"name": {"shape": [..]}}) and "__metadata__" (an
// object of strings): three levels; anything deeper is refused before it is built.
constexpr int kMaxHeaderDepth = 8;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

DType dtype_from_safetensors(const std::string& file, const std::string& tensor, const std::string& name, bool& float8_e4m3) {
  float8_e4m3 = name == "F8_E4M3";
  if (float8_e4m3) return DType::kU8;  // the bytes, as the FP8 kernels take them
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "F64") return DType::kF64;
  if (name == "I32") return DType::kI32;
  if (name == "U8") return DType::kU8;
  fail_argument(file + ": tensor " + quoted_excerpt(tensor) + " dtype", "one of F32, F16, BF16, F64, I32, U8, F8_E4M3", quoted_excerpt(name));
}

std::string dtype_to_safetensors(DType dtype, bool float8_e4m3) {
  if (float8_e4m3) return "F8_E4M3";
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF64: return "F64";
    case DType::kI32: return "I32";
    case DType::kU8: return "U8";
  }
  return "F32";
}

uint64_t json_uint(const nlohmann::json& value, const std::string& what) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0)
    fail_argument(what, "a non-negative integer", json_excerpt(value));
  return value.get<uint64_t>();
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  require_regular_file(path, "safetensors path");  // not a FIFO or device that would block or never end
  FilePtr file(std::fopen(path.c_str(), "rb"));
  if (!file) fail_argument("safetensors path", "a readable file", path);
  std::fseek(file.get(), 0, SEEK_END);
  const long size_long = std::ftell(file.get());
  std::fseek(file.get(), 0, SEEK_SET);
  const uint64_t file_size = size_long < 0 ? 0 : static_cast<uint64_t>(size_long);
  if (file_size < 8) fail_argument(path, "at least 8 bytes (the header length); file truncated", detail::concat(file_size, " bytes"));
  unsigned char len_bytes[8];
  if (std::fread(len_bytes, 1, 8, file.get()) != 8) throw Error(path + ": cannot read the header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > file_size - 8)
    fail_argument(path + ": header length", detail::concat("at most the ", file_size - 8, " bytes after it (file truncated?)"), header_len);
  if (header_len > kMaxHeaderBytes) fail_argument(path + ": header length", detail::concat("<= ", kMaxHeaderBytes), header_len);
  std::string text(header_len, '\0');
  if (std::fread(text.data(), 1, header_len, file.get()) != header_len) throw Error(path + ": cannot read the header");

  const nlohmann::json header = parse_json_limited(text, JsonLimits{kMaxHeaderBytes, kMaxHeaderDepth}, path + ": header");
  if (!header.is_object()) fail_argument(path + ": header", "a JSON object", header.type_name());

  SafetensorsFile out;
  out.path_ = path;
  out.data_offset_ = 8 + header_len;
  const uint64_t data_size = file_size - out.data_offset_;
  for (const auto& [name, value] : header.items()) {
    const std::string where = path + ": tensor " + quoted_excerpt(name);
    if (name == "__metadata__") {
      if (!value.is_object()) fail_argument(path + ": __metadata__", "an object of strings", json_excerpt(value));
      for (const auto& [key, item] : value.items()) {
        if (!item.is_string()) fail_argument(path + ": __metadata__." + key.substr(0, 60), "a string", json_excerpt(item));
        out.metadata_[key] = item.get<std::string>();
      }
      continue;
    }
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets"))
      fail_argument(where, "an object with dtype, shape and data_offsets", json_excerpt(value));
    if (!value["dtype"].is_string()) fail_argument(where + " dtype", "a string", json_excerpt(value["dtype"]));
    SafetensorsEntry entry;
    entry.name = name;
    entry.dtype = dtype_from_safetensors(path, name, value["dtype"].get<std::string>(), entry.float8_e4m3);
    if (!value["shape"].is_array()) fail_argument(where + " shape", "an array", json_excerpt(value["shape"]));
    uint64_t numel = 1;
    for (const auto& extent : value["shape"]) {
      const uint64_t e = json_uint(extent, where + " shape entry");
      entry.shape.push_back(static_cast<int64_t>(e));
      if (e != 0 && numel > (UINT64_MAX / 16) / e) fail_argument(where + " shape", "a size that fits in memory", json_excerpt(value["shape"]));
      numel *= e;
    }
    const auto& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2) fail_argument(where + " data_offsets", "[begin, end]", json_excerpt(offsets));
    entry.begin = json_uint(offsets[0], where + " data_offsets[0]");
    entry.end = json_uint(offsets[1], where + " data_offsets[1]");
    if (entry.begin > entry.end) fail_argument(where + " data_offsets", "begin <= end", json_excerpt(offsets));
    if (entry.end > data_size)
      fail_argument(where + " data_offsets", detail::concat("within the ", data_size, " data bytes (out of range; file truncated?)"), json_excerpt(offsets));
    const uint64_t expected = numel * dtype_size(entry.dtype);
    if (entry.end - entry.begin != expected)
      fail_argument(where + " byte span", detail::concat(expected, " bytes (shape ", shape_str(entry.shape), " x ", dtype_name(entry.dtype), ")"),
                    entry.end - entry.begin);
    out.entries_.push_back(std::move(entry));
  }
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : out.entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin || (a->begin == b->begin && a->end < b->end); });
  const SafetensorsEntry* furthest = nullptr;  // the entry reaching furthest so far
  for (const SafetensorsEntry* e : by_offset) {
    if (e->end == e->begin) continue;
    if (furthest != nullptr && e->begin < furthest->end)
      throw Error(detail::concat(path, ": tensor ", quoted_excerpt(e->name), " bytes [", e->begin, ", ", e->end, ") overlap tensor ",
                                 quoted_excerpt(furthest->name), " bytes [", furthest->begin, ", ", furthest->end, ")"));
    if (furthest == nullptr || e->end > furthest->end) furthest = e;
  }
  return out;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

Tensor SafetensorsFile::load(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (e == nullptr) {
    std::string names;
    for (const auto& x : entries_) names += (names.empty() ? "" : ", ") + x.name;
    fail_argument(path_ + ": tensor name", "one of [" + names + "]", name);
  }
  Tensor t = Tensor::empty(e->shape, e->dtype);
  FilePtr file(std::fopen(path_.c_str(), "rb"));
  if (!file) throw Error(path_ + ": cannot reopen file");
  const size_t bytes = static_cast<size_t>(e->end - e->begin);
  if (std::fseek(file.get(), static_cast<long>(data_offset_ + e->begin), SEEK_SET) != 0 ||
      (bytes > 0 && std::fread(t.data(), 1, bytes, file.get()) != bytes))
    throw Error(detail::concat(path_, ": tensor '", name, "': could not read ", bytes, " bytes (file changed?)"));
  return t;
}

namespace {

void check_tensor_name(const std::string& name, std::set<std::string>& names) {
  if (name.rfind("__", 0) == 0) fail_argument("write_safetensors tensor name", "not starting with __", name);
  if (!names.insert(name).second) fail_argument("write_safetensors tensor name", "unique names", name);
}

// The 8-byte length and the padded JSON header of `entries` (their offsets assigned in order).
std::string header_bytes(std::vector<SafetensorsEntry>& entries, const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  std::set<std::string> names;
  uint64_t offset = 0;
  for (SafetensorsEntry& entry : entries) {
    check_tensor_name(entry.name, names);
    if (entry.float8_e4m3 && entry.dtype != DType::kU8)
      fail_argument("write_safetensors " + entry.name + " (F8_E4M3)", "uint8 bytes", dtype_name(entry.dtype));
    entry.begin = offset;
    entry.end = offset += static_cast<uint64_t>(shape_numel(entry.shape)) * dtype_size(entry.dtype);
    header[entry.name] = {{"dtype", dtype_to_safetensors(entry.dtype, entry.float8_e4m3)}, {"shape", entry.shape},
                          {"data_offsets", {entry.begin, entry.end}}};
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // the format pads the header with spaces
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  return bytes + text;
}

}  // namespace

std::string safetensors_bytes(const std::vector<std::pair<std::string, TensorView>>& tensors,
                              const std::map<std::string, std::string>& metadata, const std::set<std::string>& float8_e4m3) {
  std::vector<SafetensorsEntry> entries;
  std::vector<Tensor> contiguous;
  for (const auto& [name, view] : tensors) {
    check_device(view, Device::cpu(), "write_safetensors " + name);
    Tensor copy = Tensor::empty(view.shape(), view.dtype());
    copy_convert(view, copy.view());
    entries.push_back({name, view.dtype(), view.shape(), 0, 0, float8_e4m3.count(name) > 0});
    contiguous.push_back(std::move(copy));
  }
  for (const std::string& name : float8_e4m3)
    if (std::none_of(entries.begin(), entries.end(), [&](const SafetensorsEntry& e) { return e.name == name; }))
      fail_argument("write_safetensors float8_e4m3 name", "a tensor being written", name);
  std::string bytes = header_bytes(entries, metadata);
  bytes.reserve(bytes.size() + (entries.empty() ? 0 : entries.back().end));
  for (const Tensor& t : contiguous) bytes.append(static_cast<const char*>(t.data()), t.nbytes());
  return bytes;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata, const std::set<std::string>& float8_e4m3) {
  const std::string bytes = safetensors_bytes(tensors, metadata, float8_e4m3);
  std::ofstream out(path, std::ios::binary);
  if (!out) fail_argument("write_safetensors path", "a writable file", path);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw Error("write_safetensors: I/O error writing " + path);
}

void write_safetensors_streamed(const std::string& path, std::vector<SafetensorsEntry> entries,
                                const std::map<std::string, std::string>& metadata,
                                const std::function<TensorView(size_t index)>& produce) {
  const std::string header = header_bytes(entries, metadata);
  std::ofstream out(path, std::ios::binary);
  if (!out) fail_argument("write_safetensors path", "a writable file", path);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (size_t i = 0; i < entries.size(); ++i) {
    const TensorView view = produce(i);
    check_device(view, Device::cpu(), "write_safetensors " + entries[i].name);
    if (view.dtype() != entries[i].dtype || view.shape() != entries[i].shape || !view.is_contiguous())
      fail_argument("write_safetensors " + entries[i].name, detail::concat("a contiguous ", dtype_name(entries[i].dtype), " tensor of shape ",
                                                                           shape_str(entries[i].shape)),
                    detail::concat(dtype_name(view.dtype()), " ", shape_str(view.shape())));
    out.write(static_cast<const char*>(view.data()), static_cast<std::streamsize>(view.nbytes()));
  }
  if (!out) throw Error("write_safetensors: I/O error writing " + path);
}

}  // namespace tessel
