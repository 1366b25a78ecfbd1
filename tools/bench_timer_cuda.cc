// The CUDA timer of `tessel bench`: two CUDA events on the context's stream around the timed
// work, so the time is the device's, not the host's launch overhead. Compiled only with CUDA.
#ifdef TESSEL_WITH_CUDA

#include <cuda_runtime.h>

#include <memory>

#include "bench_timer.h"
#include "tessel/core/error.h"

namespace tessel::cli {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(detail::concat("bench CUDA timer: ", what, ": ", cudaGetErrorString(status)));
}

class CudaEventTimer : public BenchTimer {
 public:
  explicit CudaEventTimer(const ExecContext& ctx) : stream_(ctx.stream) {
    check(cudaSetDevice(ctx.device.index), "cudaSetDevice");
    check(cudaEventCreate(&begin_), "cudaEventCreate");
    check(cudaEventCreate(&end_), "cudaEventCreate");
  }
  ~CudaEventTimer() override {
    cudaEventDestroy(begin_);
    cudaEventDestroy(end_);
  }
  CudaEventTimer(const CudaEventTimer&) = delete;
  CudaEventTimer& operator=(const CudaEventTimer&) = delete;

  void start() override { check(cudaEventRecord(begin_, stream_), "cudaEventRecord"); }
  double stop_ms() override {
    check(cudaEventRecord(end_, stream_), "cudaEventRecord");
    check(cudaEventSynchronize(end_), "cudaEventSynchronize");
    float ms = 0.f;
    check(cudaEventElapsedTime(&ms, begin_, end_), "cudaEventElapsedTime");
    return ms;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t begin_ = nullptr, end_ = nullptr;
};

BenchTimerRegistration cuda_timer{DeviceType::kCUDA, [](const ExecContext& ctx) {
                                    return std::unique_ptr<BenchTimer>(std::make_unique<CudaEventTimer>(ctx));
                                  }};

}  // namespace
}  // namespace tessel::cli

#endif  // TESSEL_WITH_CUDA
