// The engine of engine.h: one dispatch thread takes the scheduler's next request, runs it on the
// worker group and gives it its final answer; everything else (HTTP threads) only submits,
// polls and cancels through the scheduler.
#include "tessel/engine/engine.h"

#include <atomic>
#include <mutex>

#include "tessel/core/log.h"
#include "tessel/engine/pipeline_runner.h"
#include "worker_group.h"

namespace tessel::engine {
namespace {
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
}  // namespace

struct Engine::State {
  std::unique_ptr<WorkerGroup> workers;
  std::atomic<bool> stopping{false};
  std::mutex shutdown_mutex;
  mutable std::mutex stats_mutex;
  int64_t requests_started = 0;
  double queue_seconds_total = 0.0;
  int64_t steps_total = 0;
  double step_seconds_total = 0.0;
  double last_attention_density = 1.0;
  int64_t device_memory_used_bytes = -1;
  std::vector<int> worker_pids;
  bool healthy = false;
  std::string last_worker_error;
  int64_t worker_restarts = 0;

  void refresh_worker_stats() {
    std::lock_guard lock(stats_mutex);
    const std::vector<pid_t> pids = workers->pids();
    worker_pids.assign(pids.begin(), pids.end());
    healthy = workers->healthy();
    last_worker_error = workers->last_error();
    worker_restarts = workers->restarts();
  }
};

Engine::Engine(EngineConfig config, ProcessorRegistry processors)
    : config_(std::move(config)),
      processors_(std::move(processors)),
      scheduler_(config_.max_queue, config_.keep_finished),
      state_(std::make_unique<State>()) {
  if (config_.model_type.empty()) config_.model_type = read_model_type(config_.model_dir);
  if (!processors_.has(config_.model_type))
    fail_argument("model type", "one with pre- and post-processing registered", quoted_excerpt(config_.model_type));
  WorkerGroupConfig group;
  group.worker_command = config_.worker_command;
  group.num_workers = config_.num_workers;
  group.model_type = config_.model_type;
  group.setup.model_dir = config_.model_dir;
  group.setup.config_json = config_.runner_config_json;
  group.start_timeout = config_.worker_start_timeout;
  group.stall_timeout = config_.worker_stall_timeout;
  group.channel_prefix = config_.channel_prefix;
  state_->workers = std::make_unique<WorkerGroup>(std::move(group));
  state_->workers->start();
  state_->refresh_worker_stats();
  dispatcher_ = std::thread([this] { dispatch_loop(); });
}

Engine::~Engine() { shutdown(ShutdownMode::kCancel); }

std::string Engine::submit(GenerationRequest request, const std::string& id_prefix) {
  processors_.pre_process(config_.model_type, request);
  return scheduler_.submit(std::move(request), id_prefix);
}

EngineStats Engine::stats() const {
  EngineStats stats;
  stats.counts = scheduler_.counts();
  std::lock_guard lock(state_->stats_mutex);
  stats.healthy = state_->healthy;
  stats.last_worker_error = state_->last_worker_error;
  stats.worker_restarts = state_->worker_restarts;
  stats.worker_pids = state_->worker_pids;
  stats.requests_started = state_->requests_started;
  stats.queue_seconds_total = state_->queue_seconds_total;
  stats.steps_total = state_->steps_total;
  stats.step_seconds_total = state_->step_seconds_total;
  stats.last_attention_density = state_->last_attention_density;
  stats.device_memory_used_bytes = state_->device_memory_used_bytes;
  return stats;
}

GenerationOutput Engine::run_one(RunningRequest& running) {
  const auto started = Clock::now();
  {
    std::lock_guard lock(state_->stats_mutex);
    ++state_->requests_started;
    state_->queue_seconds_total += running.queued_seconds;
  }
  const auto deadline = config_.request_timeout.count() > 0 ? started + config_.request_timeout : Clock::time_point::max();
  const std::string& id = running.request.id;
  WorkerOutcome outcome = state_->workers->execute(
      running,
      [&](const RequestProgress& progress) {
        scheduler_.report_progress(id, progress);
        if (!progress.step_finished) return;  // a phase or a decode chunk: the job's status only
        std::lock_guard lock(state_->stats_mutex);
        ++state_->steps_total;
        state_->step_seconds_total += progress.step_seconds;
        state_->last_attention_density = progress.attention_density;
        state_->device_memory_used_bytes = progress.device_memory_used_bytes;
      },
      deadline);
  state_->refresh_worker_stats();
  GenerationOutput output;
  output.status = outcome.status;
  output.error = std::move(outcome.error);
  output.steps_done = outcome.steps_done;
  if (output.status == RequestStatus::kSucceeded) {
    try {
      output.media = processors_.post_process(config_.model_type, running.request, outcome.outputs);
    } catch (const std::exception& e) {
      output.status = RequestStatus::kFailed;
      output.error = std::string("post-processing failed: ") + e.what();
    }
  }
  output.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return output;
}

void Engine::dispatch_loop() {
  for (;;) {
    std::shared_ptr<RunningRequest> running = scheduler_.next(milliseconds(100));
    if (!running) {
      if (state_->stopping && scheduler_.counts().queued == 0) return;
      state_->workers->check_health();
      state_->refresh_worker_stats();
      continue;
    }
    GenerationOutput output;
    try {
      output = run_one(*running);
    } catch (const std::exception& e) {  // a broken message from a worker: the request fails, the loop goes on
      output.status = RequestStatus::kFailed;
      output.error = std::string("engine error: ") + e.what();
    }
    if (!scheduler_.finish(running->request.id, std::move(output)))
      log_message(LogLevel::kError, "request " + running->request.id + " was answered twice");
  }
}

void Engine::shutdown(ShutdownMode mode) {
  std::lock_guard lock(state_->shutdown_mutex);
  scheduler_.stop_accepting();
  if (mode == ShutdownMode::kCancel) {
    scheduler_.cancel_queued("cancelled: the server is shutting down");
    scheduler_.cancel_running();
  }
  state_->stopping = true;
  scheduler_.close();
  if (dispatcher_.joinable()) dispatcher_.join();
  state_->workers->stop();
  state_->refresh_worker_stats();
}

}  // namespace tessel::engine
