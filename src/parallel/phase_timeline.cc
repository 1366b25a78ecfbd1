// Phase timing with host clocks and CUDA events (see phase_timeline.h).
#include "tessel/parallel/phase_timeline.h"

#include "tessel/core/error.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>

#include "tessel/kernels/cuda/device_guard.h"
#endif

namespace tessel {
namespace {

#ifdef TESSEL_WITH_CUDA
void check_cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw Error(detail::concat("PhaseTimeline: ", call, " failed: ", cudaGetErrorString(status)));
}
#endif

double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

PhaseTimeline::PhaseTimeline(Device device) : device_(device) {
#ifndef TESSEL_WITH_CUDA
  if (device.is_cuda()) fail_argument("device", "cpu (tessel was built without CUDA)", device.str());
#endif
}

PhaseTimeline::~PhaseTimeline() {
#ifdef TESSEL_WITH_CUDA
  for (void* event : events_) cudaEventDestroy(static_cast<cudaEvent_t>(event));
#endif
}

void* PhaseTimeline::event_at(size_t index) {
#ifdef TESSEL_WITH_CUDA
  while (events_.size() <= index) {
    cuda::DeviceGuard guard(device_.index);
    cudaEvent_t event = nullptr;
    check_cuda(cudaEventCreate(&event), "cudaEventCreate");
    events_.push_back(event);
  }
  return events_[index];
#else
  return nullptr;
#endif
}

void PhaseTimeline::begin(const ExecContext& ctx) {
  marks_.clear();
#ifdef TESSEL_WITH_CUDA
  if (device_.is_cuda())
    check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(event_at(0)), static_cast<cudaStream_t>(ctx.stream)), "cudaEventRecord");
#endif
  start_ = std::chrono::steady_clock::now();
}

void PhaseTimeline::mark(const ExecContext& ctx, std::string_view phase) {
#ifdef TESSEL_WITH_CUDA
  if (device_.is_cuda())
    check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(event_at(marks_.size() + 1)), static_cast<cudaStream_t>(ctx.stream)),
               "cudaEventRecord");
#endif
  marks_.push_back({std::string(phase), std::chrono::steady_clock::now()});
}

std::vector<PhaseTimeline::Phase> PhaseTimeline::phases() const {
#ifdef TESSEL_WITH_CUDA
  if (device_.is_cuda() && !marks_.empty())
    check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[marks_.size()])), "cudaEventSynchronize");
#endif
  std::vector<Phase> out;
  auto previous_host = start_;
  for (size_t i = 0; i < marks_.size(); ++i) {
    const double host = ms_between(previous_host, marks_[i].host);
    double device = host;
#ifdef TESSEL_WITH_CUDA
    if (device_.is_cuda()) {
      float elapsed = 0.0f;
      check_cuda(cudaEventElapsedTime(&elapsed, static_cast<cudaEvent_t>(events_[i]), static_cast<cudaEvent_t>(events_[i + 1])),
                 "cudaEventElapsedTime");
      device = elapsed;
    }
#endif
    previous_host = marks_[i].host;
    Phase* slot = nullptr;
    for (Phase& p : out)
      if (p.name == marks_[i].name) slot = &p;
    if (slot == nullptr) slot = &out.emplace_back(Phase{marks_[i].name, 0.0, 0.0});
    slot->host_ms += host;
    slot->device_ms += device;
  }
  return out;
}

}  // namespace tessel
