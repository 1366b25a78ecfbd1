#include "tessel/core/dynamic_library.h"

#include <dlfcn.h>

#include "tessel/core/error.h"

namespace tessel {

void* open_runtime_library(const char* soname, const std::string& purpose, const std::string& advice) {
  void* library = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) throw Error(detail::concat(purpose, ": ", soname, " could not be opened (", dlerror(), "); ", advice));
  return library;
}

void* runtime_library_symbol(void* library, const char* soname, const char* symbol) {
  void* address = dlsym(library, symbol);
  if (address == nullptr) throw Error(detail::concat(soname, " has no symbol ", symbol));
  return address;
}

}  // namespace tessel
