#include "device_estimate_state.h"

#include <cuda_runtime.h>

#include "tessel/kernels/cuda/device_guard.h"
#include "tessel/core/error.h"
#include "tessel/sparse/pattern_backends.h"

namespace tessel::detail {

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(concat("dynamic backend statistics: ", what, ": ", cudaGetErrorString(status)));
}

// True when the current stream is being captured into a graph: then no event or copy may be
// recorded for statistics (the query calls below are not allowed during capture either).
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();  // e.g. the legacy stream while another stream captures: treat as capturing
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace

struct DeviceEstimateState::Events {
  cudaEvent_t start = nullptr, stop = nullptr;
  int32_t* kept_blocks = nullptr;  // pinned host copy of indptr[rows]
  double all_blocks = 1.0;
};

DeviceEstimateState::DeviceEstimateState(const AttentionShape& shape, const PatternSpec& spec)
    : mask_(BlockMaskShape{shape.batch, shape.num_qo_heads, shape.seq_q, shape.seq_kv, spec.block_q, spec.block_kv},
            shape.num_kv_heads, shape.head_dim, shape.device,
            spec.type == PatternType::kThreshold ? xattention_options_from_spec(spec).stride : 0),
      events_(std::make_unique<Events>()) {
  cuda::DeviceGuard guard(shape.device.index);  // events are created on the current device
  check(cudaEventCreate(&events_->start), "cudaEventCreate");
  check(cudaEventCreate(&events_->stop), "cudaEventCreate");
  check(cudaMallocHost(&events_->kept_blocks, sizeof(int32_t)), "cudaMallocHost");
  events_->all_blocks = static_cast<double>(mask_.shape().num_rows() * mask_.shape().kv_blocks());
}

DeviceEstimateState::~DeviceEstimateState() {
  if (events_->start) cudaEventDestroy(events_->start);
  if (events_->stop) cudaEventDestroy(events_->stop);
  if (events_->kept_blocks) cudaFreeHost(events_->kept_blocks);
}

void DeviceEstimateState::begin(StreamHandle stream) {
  recording_ = !capturing(stream);
  if (recording_) check(cudaEventRecord(events_->start, stream), "cudaEventRecord");
}

void DeviceEstimateState::end(StreamHandle stream) {
  if (!recording_) return;
  const int32_t* count = mask_.view().indptr + mask_.shape().num_rows();
  check(cudaMemcpyAsync(events_->kept_blocks, count, sizeof(int32_t), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaEventRecord(events_->stop, stream), "cudaEventRecord");
  pending_ = true;
}

std::optional<ForwardStats> DeviceEstimateState::finished(StreamHandle stream) {
  if (pending_ && !capturing(stream)) {
    const cudaError_t status = cudaEventQuery(events_->stop);
    if (status == cudaSuccess) {
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, events_->start, events_->stop), "cudaEventElapsedTime");
      last_ = ForwardStats{static_cast<double>(*events_->kept_blocks) / events_->all_blocks, static_cast<double>(ms)};
      pending_ = false;
    } else if (status != cudaErrorNotReady) {
      check(status, "cudaEventQuery");
    }
  }
  return last_;
}

}  // namespace tessel::detail
