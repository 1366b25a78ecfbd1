#include "tessel/kernels/cuda/launch_check.h"

#include <cuda_runtime.h>

#include "tessel/core/error.h"

namespace tessel::cuda {

void check_launch(const char* what) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw Error(detail::concat(what, ": CUDA launch failed: ", cudaGetErrorString(status)));
}

}  // namespace tessel::cuda
