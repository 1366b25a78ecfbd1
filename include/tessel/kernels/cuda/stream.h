// The CUDA stream that tessel's kernels launch on (CUDA builds only). Defaults to the legacy default
// stream; a caller that captures a CUDA graph or overlaps work sets its own stream for the
// current thread with StreamGuard.
#pragma once

#include <cuda_runtime.h>

namespace tessel::cuda {

cudaStream_t current_stream();
void set_current_stream(cudaStream_t stream);

// Sets the current thread's stream for its lifetime, then restores the previous one.
class StreamGuard {
 public:
  explicit StreamGuard(cudaStream_t stream) : previous_(current_stream()) { set_current_stream(stream); }
  ~StreamGuard() { set_current_stream(previous_); }
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  cudaStream_t previous_;
};

// Throws tessel::Error naming `what` when a launch or runtime call failed.
void check_launch(const char* what);

}  // namespace tessel::cuda
