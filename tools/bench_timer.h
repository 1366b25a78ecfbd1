// Timing for `tessel bench`, per device. The CPU timer (wall clock) is built in; a device backend
// registers its own (e.g. CUDA events in a CUDA-only file) with a static BenchTimerRegistration,
// so the bench loop itself never names a device API.
#pragma once

#include <functional>
#include <memory>

#include "tessel/core/exec_context.h"

namespace tessel::cli {

class BenchTimer {
 public:
  virtual ~BenchTimer() = default;
  virtual void start() = 0;
  // Milliseconds since start(), after the timed work has finished on the device.
  virtual double stop_ms() = 0;
};

// The timer measures the work run under `ctx` (its device; on CUDA its stream).
using BenchTimerFactory = std::function<std::unique_ptr<BenchTimer>(const ExecContext& ctx)>;

struct BenchTimerRegistration {
  BenchTimerRegistration(DeviceType type, BenchTimerFactory factory);
};

// Throws Error when no timer is registered for the context's device type.
std::unique_ptr<BenchTimer> make_bench_timer(const ExecContext& ctx);

}  // namespace tessel::cli
