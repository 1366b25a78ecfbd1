#include "tessel/core/exec_context.h"

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "tessel/core/allocator.h"
#include "tessel/core/error.h"
#include "tessel/core/parallel.h"

namespace tessel {
namespace {

TEST(ExecContext, DefaultMeansCpuDefaultStreamNoWorkspace) {
  const ExecContext ctx;
  EXPECT_TRUE(ctx.device.is_cpu());
  EXPECT_EQ(ctx.stream, nullptr);
  EXPECT_EQ(ctx.workspace, nullptr);
  EXPECT_EQ(ctx.num_threads, 0);
  EXPECT_EQ(ctx.threads(), max_threads());
  static_assert(std::is_same_v<StreamHandle, CUstream_st*>);
}

TEST(ExecContext, ThreadCountOverridesTheDefault) {
  ExecContext ctx;
  ctx.num_threads = 3;
  EXPECT_EQ(ctx.threads(), 3);
  ctx.num_threads = -1;
  EXPECT_EQ(ctx.threads(), max_threads());
}

TEST(ExecContext, LogsToItsOwnSinkAtItsOwnLevel) {
  std::vector<std::string> seen;
  ExecContext ctx;
  ctx.log_sink = [&](LogLevel, std::string_view message) { seen.emplace_back(message); };
  ctx.log_level = LogLevel::kWarning;
  ctx.log(LogLevel::kInfo, "dropped");
  ctx.log(LogLevel::kWarning, "kept");
  ctx.log(LogLevel::kDebug, "dropped too");
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], "kept");

  // Without a sink of its own a context writes to the process-wide one, with its own level.
  std::vector<std::string> global;
  const LogSink previous = set_log_sink([&](LogLevel, std::string_view message) { global.emplace_back(message); });
  ExecContext verbose;
  verbose.log_level = LogLevel::kDebug;
  verbose.log(LogLevel::kDebug, "debug via context");
  ExecContext plain;
  plain.log(LogLevel::kDebug, "below the process-wide level");
  set_log_sink(previous);
  ASSERT_EQ(global.size(), 1u);
  EXPECT_EQ(global[0], "debug via context");
}

TEST(Workspace, ReserveGrowsAndNeverShrinks) {
  Workspace ws;
  EXPECT_EQ(ws.capacity(), 0u);
  ws.reserve(1000);
  EXPECT_GE(ws.capacity(), 1000u);
  ASSERT_NE(ws.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ws.data()) % kWorkspaceAlignment, 0u);
  const size_t grown = ws.capacity();
  ws.reserve(10);
  EXPECT_EQ(ws.capacity(), grown);
}

TEST(Workspace, SlicesAreAlignedDisjointAndBounded) {
  Workspace ws;
  ws.reserve(workspace_slice_bytes(10 * sizeof(float)) + workspace_slice_bytes(3));
  WorkspaceSlicer slicer(ws);
  float* a = slicer.take<float>(10, "a");
  auto* b = slicer.take<uint8_t>(3, "b");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) - reinterpret_cast<uintptr_t>(a), workspace_slice_bytes(10 * sizeof(float)));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % kWorkspaceAlignment, reinterpret_cast<uintptr_t>(a) % kWorkspaceAlignment);
  EXPECT_EQ(slicer.used(), ws.capacity());
  try {
    slicer.take<float>(1, "one float too many");
    FAIL() << "expected Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("one float too many"), std::string::npos) << message;
    EXPECT_NE(message.find("reserved"), std::string::npos) << message;
  }
}

TEST(Workspace, SuffixSharesMemoryAndCannotGrow) {
  Workspace ws;
  ws.reserve(4 * kWorkspaceAlignment);
  WorkspaceSlicer slicer(ws);
  slicer.take_bytes(1, "first");
  const Workspace rest = slicer.rest();
  EXPECT_EQ(rest.data(), ws.data() + kWorkspaceAlignment);
  EXPECT_EQ(rest.capacity(), 3 * kWorkspaceAlignment);
  Workspace copy = rest;
  EXPECT_THROW(copy.reserve(ws.capacity()), Error);
  copy.reserve(kWorkspaceAlignment);  // fits: no-op
  EXPECT_EQ(copy.data(), rest.data());
}

TEST(ExecContext, WithWorkspaceKeepsTheRest) {
  Workspace ws;
  ExecContext ctx;
  ctx.num_threads = 2;
  const ExecContext other = ctx.with_workspace(&ws);
  EXPECT_EQ(other.workspace, &ws);
  EXPECT_EQ(other.num_threads, 2);
  EXPECT_EQ(ctx.workspace, nullptr);
}

TEST(ExecContext, OnCpuDropsTheDeviceStreamAndWorkspaceAndKeepsTheRest) {
  Workspace ws;
  ExecContext ctx;
  ctx.device = Device::cuda(1);
  ctx.stream = reinterpret_cast<StreamHandle>(0x10);
  ctx.workspace = &ws;
  ctx.num_threads = 3;
  ctx.log_level = LogLevel::kError;
  const ExecContext cpu = ctx.on_cpu();
  EXPECT_TRUE(cpu.device.is_cpu());
  EXPECT_EQ(cpu.stream, nullptr);
  EXPECT_EQ(cpu.workspace, nullptr);
  EXPECT_EQ(cpu.num_threads, 3);
  EXPECT_EQ(cpu.log_level, LogLevel::kError);
  EXPECT_EQ(ctx.workspace, &ws);  // the original is untouched
}

TEST(Log, ParsesLevelNames) {
  EXPECT_EQ(parse_log_level("debug"), LogLevel::kDebug);
  EXPECT_EQ(parse_log_level("error"), LogLevel::kError);
  EXPECT_THROW(parse_log_level("loud"), Error);
}

}  // namespace
}  // namespace tessel
