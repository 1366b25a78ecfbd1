#include "tessel/core/sync_trace.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>

#include "tessel/core/log.h"

namespace tessel {
namespace {

std::atomic<bool> enabled{false};
const auto start = std::chrono::steady_clock::now();

}  // namespace

void set_sync_trace(bool on) { enabled.store(on, std::memory_order_relaxed); }
bool sync_trace_enabled() { return enabled.load(std::memory_order_relaxed); }

void sync_trace(std::string_view what) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char prefix[64];
  std::snprintf(prefix, sizeof(prefix), "sync-trace %d %.6f ", static_cast<int>(::getpid()), seconds);
  emit_log(LogLevel::kDebug, std::string(prefix).append(what));
}

SyncTraceScope::SyncTraceScope(std::string what) {
  if (!sync_trace_enabled() || what.empty()) return;
  what_ = std::move(what);
  sync_trace(what_ + ": start");
}

SyncTraceScope::~SyncTraceScope() {
  if (!what_.empty()) sync_trace(what_ + ": done");
}

}  // namespace tessel
