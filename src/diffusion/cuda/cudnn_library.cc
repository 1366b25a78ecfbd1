#include "cuda/cudnn_library.h"

#include "tessel/core/dynamic_library.h"
#include "tessel/core/error.h"

namespace tessel::vae::cuda {
namespace {

constexpr const char* kCudnnLibrary = "libcudnn.so." TESSEL_STRINGIFY(CUDNN_MAJOR);

// Every function of TESSEL_CUDNN_FUNCTIONS from the opened library.
void resolve_cudnn(void* library, CudnnApi& table) {
#define TESSEL_CUDNN_RESOLVE(name) TESSEL_RUNTIME_SYMBOL(table, library, kCudnnLibrary, name);
  TESSEL_CUDNN_FUNCTIONS(TESSEL_CUDNN_RESOLVE)
#undef TESSEL_CUDNN_RESOLVE
}

}  // namespace

const CudnnApi& cudnn() {
  static const CudnnApi api = [] {
    const CudnnApi loaded =
        load_runtime_api<CudnnApi>(kCudnnLibrary, "the Wan VAE's CUDA decoder needs cuDNN",
                                   "put the folder that holds it (cuDNN's lib folder, or the nvidia-cudnn Python package's "
                                   "nvidia/cudnn/lib) on LD_LIBRARY_PATH",
                                   resolve_cudnn);
    // The ABI of the functions above is that of the headers' major version (the soname carries it).
    const size_t version = loaded.cudnnGetVersion();
    if (version / 10000 != CUDNN_MAJOR)
      throw Error(detail::concat(kCudnnLibrary, " reports version ", version, ", expected major version ", CUDNN_MAJOR));
    return loaded;
  }();
  return api;
}

void check_cudnn(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) throw Error(detail::concat("cuDNN ", what, " failed: ", cudnn().cudnnGetErrorString(status)));
}

}  // namespace tessel::vae::cuda
