#include "tessel/kernels/cuda/stream.h"

#include "tessel/core/error.h"

namespace tessel::cuda {

namespace {
thread_local cudaStream_t g_stream = nullptr;
}

cudaStream_t current_stream() { return g_stream; }
void set_current_stream(cudaStream_t stream) { g_stream = stream; }

void check_launch(const char* what) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw Error(detail::concat(what, ": CUDA launch failed: ", cudaGetErrorString(status)));
}

}  // namespace tessel::cuda
