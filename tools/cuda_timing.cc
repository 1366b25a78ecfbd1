#include "cuda_timing.h"

#include <algorithm>
#include <vector>

#include "tessel/core/error.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/stream.h"
#endif

namespace tessel::cli {

#ifdef TESSEL_WITH_CUDA

namespace {
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(detail::concat("time_cuda: ", what, " failed: ", cudaGetErrorString(status)));
}
}  // namespace

CudaTiming time_cuda(const std::function<void()>& launch, int warmup, int reps) {
  const cudaStream_t stream = cuda::current_stream();
  for (int i = 0; i < warmup; ++i) launch();
  check(cudaStreamSynchronize(stream), "warm-up");
  std::vector<cudaEvent_t> events(static_cast<size_t>(2 * reps));
  for (cudaEvent_t& e : events) check(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(events[static_cast<size_t>(2 * i)], stream), "cudaEventRecord");
    launch();
    check(cudaEventRecord(events[static_cast<size_t>(2 * i + 1)], stream), "cudaEventRecord");
  }
  check(cudaStreamSynchronize(stream), "timed runs");
  std::vector<double> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    float t = 0.f;
    check(cudaEventElapsedTime(&t, events[static_cast<size_t>(2 * i)], events[static_cast<size_t>(2 * i + 1)]),
          "cudaEventElapsedTime");
    ms[static_cast<size_t>(i)] = t;
  }
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  CudaTiming r;
  r.reps = reps;
  if (reps == 0) return r;
  std::sort(ms.begin(), ms.end());
  r.median_ms = ms[ms.size() / 2];
  r.min_ms = ms.front();
  return r;
}

std::string cuda_device_summary() {
  int device = 0, driver = 0, runtime = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "no CUDA device";
  }
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  return detail::concat(prop.name, ", ", prop.multiProcessorCount, " SMs, CUDA driver API ", driver / 1000, ".",
                        (driver % 1000) / 10, ", runtime ", runtime / 1000, ".", (runtime % 1000) / 10);
}

#else

CudaTiming time_cuda(const std::function<void()>&, int, int) {
  throw Error("time_cuda: tessel was built without CUDA (configure with -DTESSEL_CUDA=ON)");
}

std::string cuda_device_summary() { return "tessel built without CUDA"; }

#endif

}  // namespace tessel::cli
