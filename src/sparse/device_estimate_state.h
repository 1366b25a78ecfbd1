// Internal: what a dynamic pattern backend keeps per CUDA plan — the device mask (allocated once
// per plan, refilled by every forward) and lazily read statistics. Only in CUDA builds.
//
// Statistics never synchronize: around the estimator's launches forward records two CUDA events
// and copies the mask's block count (indptr[rows], 4 bytes) to pinned host memory, all in stream
// order. A later forward reads them with cudaEventQuery once they have completed. So the
// ForwardStats a CUDA forward returns are those of the latest *earlier* forward of this plan whose
// estimate has finished; before any has, density is the plan's target and estimate_ms 0. Nothing
// is recorded while the stream is being captured into a CUDA graph.
#pragma once

#include <memory>
#include <optional>

#include "tessel/sparse/backend.h"
#include "tessel/sparse/estimators/device_mask_estimation.h"

namespace tessel::detail {

class DeviceEstimateState {
 public:
  // mask for (B, H_q, S_q, S_kv, spec.block_q, spec.block_kv) on shape.device. Throws Error when
  // the device estimators cannot hold this shape (head dim, kv block count).
  DeviceEstimateState(const AttentionShape& shape, const PatternSpec& spec);
  ~DeviceEstimateState();
  DeviceEstimateState(const DeviceEstimateState&) = delete;
  DeviceEstimateState& operator=(const DeviceEstimateState&) = delete;

  DeviceEstimatedMask& mask() { return mask_; }
  const DeviceEstimatedMask& mask() const { return mask_; }

  // Call begin() before and end() after the estimator's launches on `stream`.
  void begin(StreamHandle stream);
  void end(StreamHandle stream);
  // Statistics of the latest measured forward that has finished (non-blocking), if any. Reads
  // nothing while `stream` is being captured.
  std::optional<ForwardStats> finished(StreamHandle stream);

 private:
  struct Events;
  DeviceEstimatedMask mask_;
  std::unique_ptr<Events> events_;
  bool recording_ = false;  // this forward's begin() recorded events (stream not capturing)
  bool pending_ = false;    // a recorded measurement not read yet
  std::optional<ForwardStats> last_;
};

}  // namespace tessel::detail
