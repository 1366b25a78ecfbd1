// The engine of engine.h: one dispatch thread keeps the worker group's batch filled from the
// scheduler and routes the workers' replies (BatchDispatcher); a post-process thread encodes each
// finished request and gives it its final answer; everything else (HTTP threads) only submits,
// polls and cancels through the scheduler.
#include "tessel/engine/engine.h"

#include <atomic>
#include <mutex>

#include "tessel/core/log.h"
#include "tessel/engine/pipeline_runner.h"
#include "batch_dispatcher.h"
#include "task_thread.h"
#include "worker_group.h"

namespace tessel::engine {
namespace {
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
}  // namespace

struct Engine::State {
  std::unique_ptr<WorkerGroup> workers;
  std::unique_ptr<BatchDispatcher> dispatcher;
  TaskThread post_process;
  std::atomic<bool> stopping{false};
  std::mutex shutdown_mutex;
  mutable std::mutex stats_mutex;
  int64_t requests_started = 0;
  double queue_seconds_total = 0.0;
  int64_t steps_total = 0;
  double step_seconds_total = 0.0;
  double last_attention_density = 1.0;
  int64_t device_memory_used_bytes = -1;
  Histogram batch_sizes{{1, 2, 4, 8, 16, 32, 64}};
  Histogram queue_seconds{{0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300}};
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
  group.max_batch = config_.max_batch;
  group.max_reference_bytes = config_.max_reference_bytes;
  if (config_.max_batch > 1 && config_.num_workers > 1)
    fail_argument("max_batch", detail::concat("1 with a group of ", config_.num_workers,
                                              " workers (its ranks must step the same requests at every step)"),
                  config_.max_batch);
  DispatchSettings settings;
  settings.max_batch = config_.max_batch;
  settings.batch_join = config_.batch_join;
  if (config_.request_timeout_auto && !processors_.has_deadline(config_.model_type))
    fail_argument("request timeout", "a fixed one: the model type sizes no deadlines", quoted_excerpt(config_.model_type));
  state_->workers = std::make_unique<WorkerGroup>(std::move(group));
  state_->dispatcher = std::make_unique<BatchDispatcher>(settings, scheduler_, *state_->workers, dispatch_hooks());
  state_->workers->start();
  state_->refresh_worker_stats();
  dispatcher_ = std::thread([this] { dispatch_loop(); });
}

Engine::~Engine() { shutdown(ShutdownMode::kCancel); }

std::string Engine::submit(GenerationRequest request, const std::string& id_prefix) {
  processors_.pre_process(config_.model_type, request);
  request.timeout_seconds = config_.request_timeout_auto ? processors_.deadline_seconds(config_.model_type, request)
                                                         : std::chrono::duration<double>(config_.request_timeout).count();
  // The request ring holds max_batch requests of at most this many image bytes.
  const size_t image_bytes = (request.image ? request.image->size() : 0) + (request.last_image ? request.last_image->size() : 0);
  if (image_bytes > config_.max_reference_bytes)
    fail_argument(request.image ? "input_reference" : "last_frame",
                  detail::concat("images of at most ", config_.max_reference_bytes, " bytes together (the engine's max_reference_bytes)"),
                  image_bytes);
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
  stats.batch_sizes = state_->batch_sizes;
  stats.queue_seconds = state_->queue_seconds;
  stats.in_flight = state_->dispatcher->in_flight();
  stats.max_batch = config_.max_batch;
  return stats;
}

DispatchHooks Engine::dispatch_hooks() {
  DispatchHooks hooks;
  hooks.on_admit = [this](const RunningRequest& running) {
    std::lock_guard lock(state_->stats_mutex);
    ++state_->requests_started;
    state_->queue_seconds_total += running.queued_seconds;
    state_->queue_seconds.add(running.queued_seconds);
  };
  hooks.on_progress = [this](const std::string& id, const RequestProgress& progress) {
    scheduler_.report_progress(id, progress);
    if (!progress.step_finished) return;  // a phase or a decode chunk: the job's status only
    std::lock_guard lock(state_->stats_mutex);
    ++state_->steps_total;
    state_->step_seconds_total += progress.step_seconds;
    state_->last_attention_density = progress.attention_density;
    state_->device_memory_used_bytes = progress.device_memory_used_bytes;
  };
  hooks.on_step = [this](int64_t batch_size, double) {
    std::lock_guard lock(state_->stats_mutex);
    state_->batch_sizes.add(static_cast<double>(batch_size));
  };
  // Encoded on the post-process thread: the dispatch thread goes on taking the workers' replies.
  hooks.on_outcome = [this](std::shared_ptr<RunningRequest> running, WorkerOutcome outcome) {
    state_->post_process.post([this, running = std::move(running), outcome = std::move(outcome)]() mutable {
      GenerationOutput output;
      output.status = outcome.status;
      output.error = std::move(outcome.error);
      output.steps_done = outcome.steps_done;
      if (output.status == RequestStatus::kSucceeded) {
        try {
          output.media = processors_.post_process(config_.model_type, running->request, outcome.outputs);
        } catch (const std::exception& e) {
          output.status = RequestStatus::kFailed;
          output.error = std::string("post-processing failed: ") + e.what();
        }
      }
      output.seconds = std::chrono::duration<double>(Clock::now() - running->started_at).count();
      if (!scheduler_.finish(running->request.id, std::move(output)))
        log_message(LogLevel::kError, "request " + running->request.id + " was answered twice");
    });
  };
  return hooks;
}

void Engine::dispatch_loop() {
  for (;;) {
    const bool busy = state_->dispatcher->run_once();
    if (!busy) {
      if (state_->stopping && scheduler_.counts().queued == 0) return;
      state_->workers->check_health();  // idle: a worker that died or stalled is replaced before the next request
    }
    state_->refresh_worker_stats();
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
  state_->post_process.finish();  // every answered request is encoded and final
  state_->workers->stop();
  state_->refresh_worker_stats();
}

}  // namespace tessel::engine
