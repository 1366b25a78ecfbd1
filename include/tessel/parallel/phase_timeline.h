// Where the time of one sequence-parallel forward goes, phase by phase: the host time each phase
// took to enqueue (what a per-row memcpy loop costs) and, on CUDA, the device time between events
// recorded on the stream at the phase boundaries (what the GPU spent). Phases of one name are
// summed (a ring's steps). For benchmarks: recording costs an event per phase on CUDA.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/device.h"
#include "tessel/core/exec_context.h"

namespace tessel {

class PhaseTimeline {
 public:
  struct Phase {
    std::string name;
    double host_ms = 0.0;
    double device_ms = 0.0;  // CUDA: between the events around the phase; CPU: the host time
  };

  explicit PhaseTimeline(Device device);
  ~PhaseTimeline();
  PhaseTimeline(const PhaseTimeline&) = delete;
  PhaseTimeline& operator=(const PhaseTimeline&) = delete;

  // Starts a new timeline (the previous one is dropped) at the current point of ctx.stream.
  void begin(const ExecContext& ctx);
  // Ends the phase that began at the previous mark (or at begin) and names it.
  void mark(const ExecContext& ctx, std::string_view phase);
  // The phases in order of their first occurrence, each summed over its occurrences. Waits for the
  // last event (synchronizes with the stream's work up to it).
  std::vector<Phase> phases() const;

 private:
  struct Mark {
    std::string name;
    std::chrono::steady_clock::time_point host;
  };
  void* event_at(size_t index);  // cudaEvent_t, created on first use and kept

  Device device_;
  std::chrono::steady_clock::time_point start_;
  std::vector<Mark> marks_;
  std::vector<void*> events_;  // events_[0] at begin, events_[i + 1] at marks_[i]
};

}  // namespace tessel
