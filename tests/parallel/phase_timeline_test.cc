// The phase timeline on the CPU: phases in order of first occurrence, repeated names summed, host
// and device time equal (no device), a new begin() drops the previous timeline.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tessel/parallel/phase_timeline.h"

namespace tessel {
namespace {

TEST(PhaseTimeline, SumsRepeatedPhasesInOrderOfFirstOccurrence) {
  PhaseTimeline timeline(Device::cpu());
  const ExecContext ctx;
  timeline.begin(ctx);
  timeline.mark(ctx, "dropped");
  timeline.begin(ctx);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  timeline.mark(ctx, "attention");
  timeline.mark(ctx, "merge");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  timeline.mark(ctx, "attention");
  const auto phases = timeline.phases();
  ASSERT_EQ(phases.size(), 2u);
  EXPECT_EQ(phases[0].name, "attention");
  EXPECT_EQ(phases[1].name, "merge");
  EXPECT_GE(phases[0].host_ms, 39.0);
  EXPECT_LT(phases[1].host_ms, phases[0].host_ms);
  EXPECT_DOUBLE_EQ(phases[0].device_ms, phases[0].host_ms);
}

}  // namespace
}  // namespace tessel
