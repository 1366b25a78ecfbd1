#include "cuda/cudnn_library.h"

#include <dlfcn.h>

#include "tessel/core/error.h"

namespace tessel::vae::cuda {
namespace {

#define TESSEL_CUDNN_QUOTE(x) #x
#define TESSEL_CUDNN_VERSION(x) TESSEL_CUDNN_QUOTE(x)
constexpr const char* kCudnnLibrary = "libcudnn.so." TESSEL_CUDNN_VERSION(CUDNN_MAJOR);

}  // namespace

const CudnnApi& cudnn() {
  static const CudnnApi api = [] {
    void* library = dlopen(kCudnnLibrary, RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr)
      throw Error(detail::concat("the Wan VAE's CUDA decoder needs cuDNN: ", kCudnnLibrary, " could not be opened (", dlerror(),
                                 "); put the folder that holds it (cuDNN's lib folder, or the nvidia-cudnn Python package's "
                                 "nvidia/cudnn/lib) on LD_LIBRARY_PATH"));
    CudnnApi loaded;
#define TESSEL_CUDNN_RESOLVE(name)                                                  \
  loaded.name = reinterpret_cast<decltype(&::name)>(dlsym(library, #name));         \
  if (loaded.name == nullptr) throw Error(detail::concat(kCudnnLibrary, " has no symbol ", #name));
    TESSEL_CUDNN_FUNCTIONS(TESSEL_CUDNN_RESOLVE)
#undef TESSEL_CUDNN_RESOLVE
    // The ABI of the functions above is that of the headers' major version (the soname carries it).
    const size_t version = loaded.cudnnGetVersion();
    if (version / 10000 != CUDNN_MAJOR)
      throw Error(detail::concat(kCudnnLibrary, " reports version ", version, ", expected major version ", CUDNN_MAJOR));
    return loaded;  // the library stays open for the process's lifetime
  }();
  return api;
}

void check_cudnn(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) throw Error(detail::concat("cuDNN ", what, " failed: ", cudnn().cudnnGetErrorString(status)));
}

}  // namespace tessel::vae::cuda
