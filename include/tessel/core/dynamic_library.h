// Libraries opened at run time (dlopen) rather than linked: a vendor library that only some paths
// need (cuDNN for the VAE's convolutions, cuBLASLt for the CUDA models' GEMMs), so that a build
// without it still loads and the error says where to get it.
#pragma once

#include <string>

namespace tessel {

// Opens `soname` for the rest of the process (it is never closed). Throws Error reading
// "<purpose>: <soname> could not be opened (<dlerror>); <advice>" when it cannot.
void* open_runtime_library(const char* soname, const std::string& purpose, const std::string& advice);

// The address of `symbol` in `library` (opened as `soname`); Error naming both when it is absent.
void* runtime_library_symbol(void* library, const char* soname, const char* symbol);

// A macro's value as a string literal, for sonames that carry the header's major version:
// "libcudnn.so." TESSEL_STRINGIFY(CUDNN_MAJOR).
#define TESSEL_STRINGIFY(x) TESSEL_STRINGIFY_TEXT(x)
#define TESSEL_STRINGIFY_TEXT(x) #x

// In a resolver of load_runtime_api: sets `table.name` to the symbol `name` of `library` (opened as
// `soname`), typed as the declaration of `name` in the library's header.
#define TESSEL_RUNTIME_SYMBOL(table, library, soname, name) \
  (table).name = reinterpret_cast<decltype(&::name)>(::tessel::runtime_library_symbol((library), (soname), #name))

// A table of function pointers from a library opened with open_runtime_library: `resolve(library,
// api)` fills `api` (with runtime_library_symbol per entry). The library stays open for good.
template <typename Api, typename Resolve>
Api load_runtime_api(const char* soname, const std::string& purpose, const std::string& advice, Resolve resolve) {
  void* library = open_runtime_library(soname, purpose, advice);
  Api api{};
  resolve(library, api);
  return api;
}

}  // namespace tessel
