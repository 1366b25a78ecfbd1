// Fuzzes the safetensors reader on arbitrary file contents (written to an in-memory file, the
// reader's own entry point opening it by path). Properties: open either validates the header or
// throws tessel::Error; an entry of an accepted file loads into a tensor of exactly its shape,
// dtype and byte span (or load says why not with an Error), and a name it does not hold gives an
// Error.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"

namespace {

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "safetensors property violated: %s\n", what);
    std::abort();
  }
}

// One in-memory file for the whole run, rewritten for every input.
const std::string& memory_file_path() {
  static const std::string path = [] {
    const int fd = memfd_create("safetensors_fuzz", 0);
    check(fd >= 0, "memfd_create works");
    return "/proc/self/fd/" + std::to_string(fd);
  }();
  return path;
}

void write_file(const uint8_t* data, size_t size) {
  std::FILE* file = std::fopen(memory_file_path().c_str(), "wb");  // truncates
  check(file != nullptr, "the in-memory file opens for writing");
  check(size == 0 || std::fwrite(data, 1, size, file) == size, "the in-memory file takes the input");
  std::fclose(file);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  write_file(data, size);
  tessel::SafetensorsFile file;
  try {
    file = tessel::SafetensorsFile::open(memory_file_path());
  } catch (const tessel::Error&) {
    return 0;
  }
  for (const tessel::SafetensorsEntry& entry : file.entries()) {
    check(entry.begin <= entry.end && entry.end <= size, "an entry's bytes lie inside the file");
    tessel::Tensor tensor;
    try {
      tensor = file.load(entry.name);
    } catch (const tessel::Error&) {
      continue;  // e.g. a zero-size shape whose other extents overflow a tensor's strides
    }
    check(tensor.shape() == entry.shape, "loaded shape");
    check(tensor.dtype() == entry.dtype, "loaded dtype");
    check(tensor.nbytes() == entry.end - entry.begin, "loaded bytes = the entry's byte span");
    check(file.find(entry.name) == &entry, "find returns the entry");
  }
  const std::string absent = "\x01 no tensor has this name";
  if (file.find(absent) == nullptr) {
    try {
      (void)file.load(absent);
      check(false, "loading an absent name throws");
    } catch (const tessel::Error&) {
    }
  }
  return 0;
}
