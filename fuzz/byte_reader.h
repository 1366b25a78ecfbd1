// Reads a fuzzer's input front to back as little-endian integers and strings (zeros once it runs
// out), a layout simple enough that seed files can be written by hand or by a short script.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace tessel::fuzz {

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t remaining() const { return size_ - offset_; }

  template <typename T>
  T read() {
    T value{};
    unsigned char bytes[sizeof(T)] = {};
    const size_t n = std::min(sizeof(T), remaining());
    std::memcpy(bytes, data_ + offset_, n);
    offset_ += n;
    for (size_t i = sizeof(T); i-- > 0;) value = static_cast<T>((static_cast<uint64_t>(value) << 8) | bytes[i]);
    return value;
  }

  // A length byte, then that many bytes (fewer if the input ends first).
  std::string read_string() {
    const size_t length = std::min<size_t>(read<uint8_t>(), remaining());
    std::string text(reinterpret_cast<const char*>(data_ + offset_), length);
    offset_ += length;
    return text;
  }

  std::string read_rest() {
    std::string text(reinterpret_cast<const char*>(data_ + offset_), remaining());
    offset_ = size_;
    return text;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
};

}  // namespace tessel::fuzz
