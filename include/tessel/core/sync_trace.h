// The synchronisation trace: when on, every collective (the parallel layer's traced communicator)
// and every host call that waits for a whole CUDA device (cudaFree, synchronous cudaMemcpy, a
// communicator barrier) writes one line to the log before it starts and after it returns, so that a
// multi-rank hang shows, per rank, the last call that did not return and what the other rank did
// instead. Off by default and then one relaxed atomic load per call; the library reads no
// environment (the CLI turns it on with TESSEL_TRACE_SYNC=1).
#pragma once

#include <string>
#include <string_view>

namespace tessel {

void set_sync_trace(bool on);
bool sync_trace_enabled();
// One line "sync-trace <pid> <seconds since start> <what>" through emit_log (debug level, whatever
// the minimum level). Call only when sync_trace_enabled().
void sync_trace(std::string_view what);

// Writes "<what>: start" when constructed and "<what>: done" when destroyed, when the trace is on.
class SyncTraceScope {
 public:
  explicit SyncTraceScope(std::string what);
  ~SyncTraceScope();
  SyncTraceScope(const SyncTraceScope&) = delete;
  SyncTraceScope& operator=(const SyncTraceScope&) = delete;

 private:
  std::string what_;
};

}  // namespace tessel
