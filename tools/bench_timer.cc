#include "bench_timer.h"

#include <chrono>
#include <map>

#include "tessel/core/error.h"

namespace tessel::cli {
namespace {

std::map<DeviceType, BenchTimerFactory>& registry() {
  static std::map<DeviceType, BenchTimerFactory> factories;
  return factories;
}

// CPU kernels return when their work is done, so the wall clock around the call is the time.
class WallClockTimer : public BenchTimer {
 public:
  void start() override { begin_ = std::chrono::steady_clock::now(); }
  double stop_ms() override {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin_).count();
  }

 private:
  std::chrono::steady_clock::time_point begin_;
};

BenchTimerRegistration cpu_timer{DeviceType::kCPU, [](const ExecContext&) { return std::make_unique<WallClockTimer>(); }};

}  // namespace

BenchTimerRegistration::BenchTimerRegistration(DeviceType type, BenchTimerFactory factory) {
  registry()[type] = std::move(factory);
}

std::unique_ptr<BenchTimer> make_bench_timer(const ExecContext& ctx) {
  const auto it = registry().find(ctx.device.type);
  if (it == registry().end()) fail_argument("device", "a device with a registered bench timer", ctx.device.str());
  return it->second(ctx);
}

}  // namespace tessel::cli
