// The engine's request queue: a bounded FIFO of submitted requests, the state of every request
// from submission to its one final answer, cancellation of queued and running requests, and
// per-request progress. Thread-safe: the HTTP threads submit, poll, wait and cancel; the engine's
// dispatch thread takes the next request and reports progress and the outcome.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/engine/request.h"

namespace tessel::engine {

// Thrown by submit when the queue holds max_queue requests already (HTTP 429).
class QueueFullError : public Error {
 public:
  using Error::Error;
};
// Thrown by submit once the scheduler stopped accepting (shutting down; HTTP 503).
class NotAcceptingError : public Error {
 public:
  using Error::Error;
};

// A copy of one request's state at one moment.
struct RequestSnapshot {
  GenerationRequest request;
  RequestStatus status = RequestStatus::kQueued;
  RequestProgress progress;
  std::shared_ptr<const GenerationOutput> output;  // set once final
  int64_t queue_position = -1;  // 0 = next to run, while queued
  std::chrono::system_clock::time_point created_at;
};

// What the dispatch thread works on; cancel_requested is set by cancel() while it runs.
struct RunningRequest {
  GenerationRequest request;
  std::atomic<bool> cancel_requested{false};
  std::chrono::steady_clock::time_point started_at;
  double queued_seconds = 0.0;  // from submission to started_at
};

enum class CancelOutcome : uint8_t { kNotFound, kCancelledWhileQueued, kCancelRequested, kAlreadyFinished };

struct SchedulerCounts {
  int64_t queued = 0;
  int64_t running = 0;
  // Final answers given since the start, by status.
  int64_t succeeded = 0;
  int64_t failed = 0;
  int64_t cancelled = 0;
  int64_t rejected_queue_full = 0;
};

class RequestScheduler {
 public:
  // max_queue: requests waiting (the running one not counted), >= 1. keep_finished: finished
  // requests kept for status queries until forget(), the oldest dropped beyond it.
  RequestScheduler(size_t max_queue, size_t keep_finished);

  // Queues the request under a new id ("<prefix>-<n>"; request.id is replaced) and returns it.
  std::string submit(GenerationRequest request, const std::string& id_prefix = "req");
  // The oldest queued request, marked running; waits up to `timeout`; nullptr when none came or
  // the scheduler is closed and empty.
  std::shared_ptr<RunningRequest> next(std::chrono::milliseconds timeout);
  void report_progress(const std::string& id, const RequestProgress& progress);
  // Gives the running request its final answer. Only the first answer counts (returns false for
  // a second one, or for an id that is not running).
  bool finish(const std::string& id, GenerationOutput output);

  CancelOutcome cancel(const std::string& id);
  std::optional<RequestSnapshot> snapshot(const std::string& id) const;
  // Waits until the request is final or `timeout` passed; nullopt for an unknown id.
  std::optional<RequestSnapshot> wait(const std::string& id, std::chrono::milliseconds timeout) const;
  // Drops a final request's state (answered: its output is not needed any more).
  void forget(const std::string& id);
  // Every request of `kind` the scheduler knows (queued, running, or final and not forgotten),
  // oldest first.
  std::vector<RequestSnapshot> list(OutputKind kind) const;

  // Later submits throw NotAcceptingError; queued requests stay and still run.
  void stop_accepting();
  // Cancels every queued request (their answer: cancelled, with `reason`).
  void cancel_queued(const std::string& reason);
  // Asks the running request (if any) to stop between steps.
  void cancel_running();
  // Wakes next() so a closed, empty scheduler returns nullptr at once.
  void close();
  bool accepting() const;
  SchedulerCounts counts() const;
  size_t max_queue() const { return max_queue_; }

 private:
  struct Entry {
    uint64_t sequence = 0;  // submission order
    std::chrono::steady_clock::time_point queued_at;  // for the queue time
    RequestSnapshot state;
    std::shared_ptr<RunningRequest> running;
  };
  void finalize_locked(Entry& entry, GenerationOutput output);
  RequestSnapshot snapshot_locked(const Entry& entry) const;

  const size_t max_queue_;
  const size_t keep_finished_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::map<std::string, Entry> entries_;
  std::deque<std::string> queue_;     // ids waiting, oldest first
  std::deque<std::string> finished_;  // ids final and not forgotten, oldest first
  uint64_t next_id_ = 1;
  bool accepting_ = true;
  bool closed_ = false;
  SchedulerCounts counts_;
};

}  // namespace tessel::engine
