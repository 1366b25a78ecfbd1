// The engine's side of continuous (step-level) batching: up to max_batch requests in flight on
// the worker group at once. Between the workers' steps it admits queued requests (each sent at
// once, so the worker takes it in at its next step boundary; an idle group first waits up to the
// join window for companions), routes rank 0's replies to their requests by sequence number,
// forwards cancellations and each request's own timeout (GenerationRequest::timeout_seconds, from
// its admission) to the request's lane, and watches the group: a rank that
// died or stalled fails every request in flight (they lived in its processes) before the group
// restarts. Every admitted request gets exactly one outcome.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/engine/request_scheduler.h"
#include "worker_group.h"

namespace tessel::engine {

struct DispatchSettings {
  int max_batch = 1;                             // 1..kMaxBatchLanes
  std::chrono::milliseconds batch_join{0};       // an idle group's wait for more requests before the first step
};

struct DispatchHooks {
  std::function<void(const RunningRequest&)> on_admit;
  std::function<void(const std::string& id, const RequestProgress&)> on_progress;
  std::function<void(int64_t batch_size, double seconds)> on_step;  // one step of the worker's batch
  // Exactly once per admitted request: the workers' outcome, or why the engine failed it.
  std::function<void(std::shared_ptr<RunningRequest>, WorkerOutcome)> on_outcome;
};

class BatchDispatcher {
 public:
  BatchDispatcher(DispatchSettings settings, RequestScheduler& scheduler, WorkerGroup& workers, DispatchHooks hooks);

  // One round: admission, then the workers' replies for a short while, then cancellations,
  // deadlines and the group's health. False when idle: nothing in flight and no request came
  // within 100 ms (the caller then checks the idle group's health).
  bool run_once();
  int64_t in_flight() const { return in_flight_count_.load(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct InFlight {
    std::shared_ptr<RunningRequest> running;
    int lane = 0;
    Clock::time_point deadline;
    bool timed_out = false;
  };
  void admit();
  // Sends the admitted requests to the workers in one message (those cancelled meanwhile are
  // answered at once).
  void start(std::vector<std::shared_ptr<RunningRequest>> joining);
  void take_replies();
  void supervise();
  void answer(uint64_t seq, WorkerOutcome outcome);
  // Fails every request in flight with reason(id): the caller restarts the group (they lived in its
  // processes). Answered before the restart, so the clients need not wait for the new group's start.
  void fail_all(const std::function<std::string(const std::string& id)>& reason);

  const DispatchSettings settings_;
  RequestScheduler& scheduler_;
  WorkerGroup& workers_;
  const DispatchHooks hooks_;
  std::map<uint64_t, InFlight> in_flight_;  // by sequence number
  std::vector<bool> lane_taken_;
  std::atomic<int64_t> in_flight_count_{0};
};

}  // namespace tessel::engine
