// The engine's worker processes: one per rank of the parallel group, started from a command line
// (posix_spawn), joined through a fresh shared-memory channel, handed the runner setup, and
// awaited until each reports ready. Runs one request at a time on the group: broadcasts it,
// forwards rank 0's progress, signals cancellation, and watches the processes (waitpid); a dead
// worker fails the request it was running with the reason and the whole group is started again
// (a parallel group cannot go on without one of its ranks). A group of several workers also gets a
// shared-memory world (RunnerSetup::group_world) over which its ranks build their communicators.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
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
};

struct WorkerOutcome {
  RequestStatus status = RequestStatus::kFailed;
  std::string error;
  std::vector<Tensor> outputs;
  int64_t steps_done = 0;
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
  // Runs one request. Never throws for a worker's failure: the outcome says what happened. The
  // request is cancelled between steps once `request.cancel_requested` is set or `deadline` passed.
  WorkerOutcome execute(RunningRequest& request, const std::function<void(const RequestProgress&)>& on_progress,
                        std::chrono::steady_clock::time_point deadline);
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
  void restart(const std::string& reason);
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
