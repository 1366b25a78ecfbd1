// The synchronisation trace: silent unless turned on, then one line before and one after each
// traced scope, through the log sink.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessel/core/log.h"
#include "tessel/core/sync_trace.h"

namespace tessel {
namespace {

struct CapturedLog {
  std::vector<std::string> lines;
  LogSink previous;
  CapturedLog() : previous(set_log_sink([this](LogLevel, std::string_view line) { lines.emplace_back(line); })) {}
  ~CapturedLog() { set_log_sink(previous); }
};

TEST(SyncTrace, SilentWhenOffAndOneLineBeforeAndAfterWhenOn) {
  CapturedLog log;
  ASSERT_FALSE(sync_trace_enabled());
  { const SyncTraceScope scope("cudaFree 64 bytes"); }
  EXPECT_TRUE(log.lines.empty());
  set_sync_trace(true);
  { const SyncTraceScope scope("cudaFree 64 bytes"); }
  { const SyncTraceScope nothing(""); }  // an empty description (the caller skipped formatting) writes nothing
  set_sync_trace(false);
  ASSERT_EQ(log.lines.size(), 2u);
  EXPECT_EQ(log.lines[0].rfind("sync-trace ", 0), 0u) << log.lines[0];
  EXPECT_NE(log.lines[0].find("cudaFree 64 bytes: start"), std::string::npos) << log.lines[0];
  EXPECT_NE(log.lines[1].find("cudaFree 64 bytes: done"), std::string::npos) << log.lines[1];
}

}  // namespace
}  // namespace tessel
