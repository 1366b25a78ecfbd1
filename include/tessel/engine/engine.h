// The diffusion engine: loads a model directory once per worker process (one per GPU of the
// parallel group), queues requests in a bounded FIFO, keeps up to max_batch of them in flight on
// the group (continuous batching: a request joins at the next step boundary and leaves when its
// own steps are done), and gives every request exactly one final answer. In the caller's process
// it pre-processes a request before queueing (bad fields are refused at once) and post-processes
// rank 0's raw output (encoding) by model type.
//
//   submit -> pre-process -> RequestScheduler (FIFO, max depth) -> dispatch thread
//          -> BatchDispatcher -> WorkerGroup (shared-memory broadcast to every rank; rank 0
//             returns progress, steps and raw outputs) -> post-process thread -> final state
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tessel/engine/histogram.h"
#include "tessel/engine/processing.h"
#include "tessel/engine/request.h"
#include "tessel/engine/request_scheduler.h"

namespace tessel::engine {

struct DispatchHooks;  // src/engine/batch_dispatcher.h

struct EngineConfig {
  std::string model_dir;
  std::string model_type;  // empty: the `_class_name` of model_dir/model_index.json
  // The worker program and its arguments; the engine appends "--channel NAME --rank R".
  std::vector<std::string> worker_command;
  int num_workers = 1;
  size_t max_queue = 8;
  size_t keep_finished = 256;  // final requests kept for status queries
  std::string runner_config_json = "{}";  // handed unchanged to every worker's runner factory
  std::chrono::milliseconds worker_start_timeout{120000};
  // How long a request may run, from its admission to the workers (the queue has its own bound,
  // max_queue): past it the request is stopped between steps and fails, alone (the others of its
  // batch go on). Each request's own deadline: sized from the model and the request by the model
  // type's DeadlineEstimator when request_timeout_auto (refused for a model type without one), else
  // request_timeout for every request (0: none). It is the request's timeout_seconds.
  bool request_timeout_auto = false;
  std::chrono::milliseconds request_timeout{0};
  // A worker whose heartbeat stops for this long (stopped by a signal, hung) fails its request and
  // the group is restarted; /health reports the group unhealthy meanwhile.
  std::chrono::milliseconds worker_stall_timeout{10000};
  std::string channel_prefix;  // shared-memory names; "/tessel-<pid>" when empty
  // Requests in flight on the workers at once, stepped together (1..64; 1: one request at a time).
  // A group of several workers takes 1 only: its ranks must step the same requests (refused otherwise).
  int max_batch = 1;
  // The most bytes of reference images (GenerationRequest::image and last_image together) one
  // request may carry: the request ring is sized for max_batch such requests. 0: no images (a
  // request with one is refused).
  size_t max_reference_bytes = 0;
  // An idle group's wait for more requests after the first, before their first step (0: none).
  std::chrono::milliseconds batch_join{0};
};

enum class ShutdownMode : uint8_t {
  kDrain,   // run what is queued and running to the end
  kCancel,  // cancel what is queued, stop the running requests between steps
};

struct EngineStats {
  SchedulerCounts counts;
  bool healthy = false;
  std::string last_worker_error;
  int64_t worker_restarts = 0;
  std::vector<int> worker_pids;
  int64_t requests_started = 0;      // requests taken from the queue to the workers
  double queue_seconds_total = 0.0;  // their summed time in the queue
  int64_t steps_total = 0;           // denoising steps reported over all requests
  double step_seconds_total = 0.0;   // their summed time
  double last_attention_density = 1.0;
  int64_t device_memory_used_bytes = -1;  // the last step's report; -1: no GPU
  int64_t in_flight = 0;  // requests on the workers now (the current batch)
  int max_batch = 1;
  Histogram batch_sizes;    // requests per step of the workers' batch
  Histogram queue_seconds;  // per request, from submission to admission into the batch
};

class Engine {
 public:
  // Starts the workers and waits for their handshake. Throws Error when the model type has no
  // processors or a worker cannot start (with the worker's own message).
  Engine(EngineConfig config, ProcessorRegistry processors);
  ~Engine();  // shutdown(kCancel)
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Pre-processes and queues a request; returns its id ("<id_prefix>-<n>"). Throws Error naming a
  // refused field, QueueFullError when max_queue requests wait, NotAcceptingError once shut down.
  std::string submit(GenerationRequest request, const std::string& id_prefix = "req");
  RequestScheduler& scheduler() { return scheduler_; }
  const std::string& model_type() const { return config_.model_type; }
  const EngineConfig& config() const { return config_; }
  EngineStats stats() const;

  // Stops accepting, then drains or cancels (see ShutdownMode), stops the workers and returns
  // once the dispatch thread ended. Idempotent.
  void shutdown(ShutdownMode mode);

 private:
  void dispatch_loop();
  DispatchHooks dispatch_hooks();  // the dispatcher's callbacks into the stats and the post-process thread

  EngineConfig config_;
  ProcessorRegistry processors_;
  RequestScheduler scheduler_;
  struct State;
  std::unique_ptr<State> state_;
  std::thread dispatcher_;
};

}  // namespace tessel::engine
