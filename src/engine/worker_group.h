// The engine's worker processes: one per rank of the parallel group, started from a command line
// (posix_spawn), joined through a fresh shared-memory channel, handed the runner setup, and
// awaited until each reports ready. Sends the group requests (each under its own sequence number,
// in a lane: its cancel slot), signals their cancellation, hands back rank 0's replies (progress,
// a step's batch size, results) and watches the processes (waitpid, heartbeats); a dead worker
// ends the requests it was running (the engine's batch dispatcher fails them with the reason) and
// the whole group is started again (a parallel group cannot go on without one of its ranks). A group of several workers also gets a
// shared-memory world (RunnerSetup::group_world) over which its ranks build their communicators.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessel/core/tensor.h"
#include "tessel/engine/pipeline_runner.h"
#include "tessel/engine/request.h"
#include "tessel/engine/request_scheduler.h"
#include "tessel/parallel/communicator.h"

namespace tessel::engine {

struct WorkerGroupConfig {
  std::vector<std::string> worker_command;  // argv; "--channel NAME --rank R" are appended
  int num_workers = 1;
  std::string model_type;
  RunnerSetup setup;  // rank and world_size filled per worker
  std::chrono::milliseconds start_timeout{120000};
  // How long a request may go on after its deadline once cancelled: a group that has not answered
  // by then is taken as stuck (a rank waiting in a collective for one that failed) and restarted.
  std::chrono::milliseconds stuck_grace{30000};
  // A rank whose heartbeat (worker_channel.h) is older than this is taken as stalled (stopped by a
  // signal, or hung as a whole): its request fails and the group is restarted.
  std::chrono::milliseconds stall_timeout{10000};
  std::string channel_prefix;  // "/tessel-<pid>" unless set
  int max_batch = 1;  // requests the engine keeps unanswered at most (sizes the request ring)
  // The most reference-image bytes one request carries (EngineConfig::max_reference_bytes; sizes
  // the request ring too). 0: requests carry none.
  size_t max_reference_bytes = 0;
};

struct WorkerOutcome {
  RequestStatus status = RequestStatus::kFailed;
  std::string error;
  std::vector<Tensor> outputs;
  int64_t steps_done = 0;
};

// One message from rank 0: a request's progress or result, or a step of the batch.
struct WorkerReply {
  enum Kind : uint8_t { kProgress, kStep, kResult } kind = kProgress;
  uint64_t seq = 0;  // the request's (progress, result)
  RequestProgress progress;
  WorkerOutcome outcome;   // kResult
  int64_t batch_size = 0;  // kStep: the requests that ran the step
  double step_seconds = 0.0;
};

class WorkerGroup {
 public:
  explicit WorkerGroup(WorkerGroupConfig config);
  ~WorkerGroup();  // stop()
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts the processes and waits for every rank's handshake. Throws Error with the failing
  // rank's own message (or its exit status) when one cannot start.
  void start();
  // Sends requests to every rank in one message (so that the workers admit them at the same step
  // boundary), each in its lane (0..kMaxBatchLanes-1, free: the lane's previous request was
  // answered); returns the first one's sequence number (the others follow it), or 0 when the group
  // is down or took no message within 5 s (then it was restarted: every request it ran is lost and
  // is to be failed by the caller).
  struct SentRequest {
    const GenerationRequest* request;
    int lane;
  };
  uint64_t send_requests(std::span<const SentRequest> requests);
  // Asks the workers to stop request `seq` (in `lane`) between steps.
  void cancel(uint64_t seq, int lane);
  // Rank 0's next reply within `timeout`. Throws Error for a malformed message.
  std::optional<WorkerReply> receive(std::chrono::milliseconds timeout);
  // While requests run: why the group cannot go on (a rank exited, reaped; or its heartbeat
  // stopped), "" when it can. The caller fails the running requests and calls restart.
  std::string running_failure();
  void restart(const std::string& reason);
  const WorkerGroupConfig& config() const { return config_; }
  // Between requests: restarts the group when a worker died while idle (false when it could not).
  bool check_health();
  // Asks every worker to exit, waits up to `grace`, then kills what is left.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(5000));

  bool healthy() const { return healthy_; }
  std::string last_error() const { return last_error_; }
  int64_t restarts() const { return restarts_; }
  std::vector<pid_t> pids() const;

 private:
  struct Channel;
  // The first rank that exited, with its status described ("" when all live); reaps it.
  std::string reap_dead_worker();
  // "worker rank R (pid P) made no progress for N ms ..." for a live rank whose heartbeat is older
  // than config_.stall_timeout; "" otherwise.
  std::string stalled_worker() const;
  void kill_all();

  WorkerGroupConfig config_;
  std::unique_ptr<Channel> channel_;
  std::vector<pid_t> pids_;
  uint64_t next_seq_ = 1;
  int64_t generation_ = 0;
  int64_t restarts_ = 0;
  bool healthy_ = false;
  std::string last_error_;
};

}  // namespace tessel::engine
