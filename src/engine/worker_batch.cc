// The worker's requests in flight of worker_batch.h.
#include "worker_batch.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#if TESSEL_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "tessel/core/error.h"
#include "tessel/core/log.h"

namespace tessel::engine {
namespace {

constexpr std::chrono::milliseconds kSendTimeout{30000};

// Device memory in use on this process's current GPU (all processes' use of that GPU, as the
// driver reports it), -1 without a GPU.
int64_t device_memory_used_bytes() {
#if TESSEL_WITH_CUDA
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return -1;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return -1;
  return static_cast<int64_t>(total_bytes - free_bytes);
#else
  return -1;
#endif
}

}  // namespace

WorkerBatch::WorkerBatch(PipelineRunner& runner, WorkerControlBlock& control, MessageQueue* results, int rank, int world_size,
                         pid_t parent)
    : runner_(runner), control_(control), results_(results), rank_(rank), world_size_(world_size), parent_(parent) {}

void WorkerBatch::send(const nlohmann::json& header, const std::string& payload) const {
  if (results_ == nullptr) return;
  const pid_t parent = parent_;
  if (!results_->send(wire::encode(header, payload), kSendTimeout, [parent] { return getppid() != parent; }))
    log_message(LogLevel::kError, detail::concat("worker rank ", rank_, ": the engine took no ", header.value("type", "message"),
                                                 " for request seq ", header.value("seq", uint64_t{0}), " (result queue full or closed)"));
}

void WorkerBatch::refresh_cancel(Job& job) const {
  if (control_.cancel_seq[job.lane].load() == job.seq) job.cancel = true;
}

void WorkerBatch::send_progress(const Job& job, RequestProgress progress) const {
  if (results_ == nullptr) return;
  progress.device_memory_used_bytes = device_memory_used_bytes();
  send({{"type", "progress"}, {"seq", job.seq}, {"progress", wire::progress_to_json(progress)}});
}

void WorkerBatch::answer_failed(const Job& job, const std::string& error) const {
  // Every rank says why (only rank 0 answers the engine): in a group the first failure may be another rank's.
  log_message(LogLevel::kError, detail::concat("worker rank ", rank_, ": request ", job.id, " failed: ", error));
  send({{"type", "result"}, {"seq", job.seq}, {"status", "failed"}, {"error", error}, {"steps_done", 0}});
}

bool WorkerBatch::admit(const wire::Message& message) {
  bool ok = true;
  for (const nlohmann::json& entry : message.header.at("requests")) ok = admit_one(entry, message.payload) && ok;
  return ok;
}

bool WorkerBatch::admit_one(const nlohmann::json& entry, std::string_view payload) {
  auto job = std::make_unique<Job>();
  job->seq = entry.at("seq").get<uint64_t>();
  job->lane = entry.at("lane").get<int>();
  TESSEL_CHECK(job->lane >= 0 && job->lane < kMaxBatchLanes, "engine message: lane ", job->lane, " outside 0..", kMaxBatchLanes - 1);
  GenerationRequest request = wire::request_from_json(entry.at("request"));
  wire::images_from_payload(entry, payload, request);
  job->id = request.id;
  refresh_cancel(*job);
  Job& j = *job;
  RunControl control;
  control.cancel = &j.cancel;
  control.on_progress = [this, &j](const RequestProgress& progress) {
    refresh_cancel(j);
    send_progress(j, progress);
  };
  try {
    job->runner_job = runner_.begin(request, control);
  } catch (const std::exception& e) {
    answer_failed(j, e.what());
    return false;
  }
  jobs_.push_back(std::move(job));
  return true;
}

std::vector<RunnerJob*> WorkerBatch::runner_jobs(bool cancelled) const {
  std::vector<RunnerJob*> jobs;
  for (const auto& job : jobs_)
    if (job->cancel.load() == cancelled && !job->runner_job->done()) jobs.push_back(job->runner_job.get());
  return jobs;
}

bool WorkerBatch::step() {
  for (const auto& job : jobs_) refresh_cancel(*job);
  bool ok = true;
  if (world_size_ == 1) {
    // A step of cancelled jobs only marks them cancelled (no forward): they leave before the others' step.
    const std::vector<RunnerJob*> cancelled = runner_jobs(true);
    if (!cancelled.empty()) {
      runner_.step(cancelled);
      ok = answer_done();
    }
  }
  std::vector<RunnerJob*> stepping = runner_jobs(false);
  if (world_size_ > 1) {  // the group's runner agrees on cancellation itself, inside its step
    const std::vector<RunnerJob*> cancelled = runner_jobs(true);
    stepping.insert(stepping.end(), cancelled.begin(), cancelled.end());
  }
  if (stepping.empty()) return ok;
  const auto started = std::chrono::steady_clock::now();
  try {
    runner_.step(stepping);
  } catch (const std::exception& e) {
    const std::string error = stepping.size() == 1
                                  ? std::string(e.what())
                                  : detail::concat(e.what(), " (in a step shared by ", stepping.size(),
                                                   " requests: each of them failed with it)");
    std::erase_if(jobs_, [&](const std::unique_ptr<Job>& job) {
      if (std::find(stepping.begin(), stepping.end(), job->runner_job.get()) == stepping.end()) return false;
      answer_failed(*job, error);
      return true;
    });
    return false;
  }
  send({{"type", "step"},
        {"batch", stepping.size()},
        {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()}});
  return answer_done() && ok;
}

bool WorkerBatch::answer_done() {
  bool ok = true;
  std::erase_if(jobs_, [&](const std::unique_ptr<Job>& job) {
    if (!job->runner_job->done()) return false;
    nlohmann::json header = {{"type", "result"}, {"seq", job->seq}};
    std::string payload;
    try {
      RunnerOutput output = runner_.finish(*job->runner_job);
      header["status"] = output.cancelled ? "cancelled" : "succeeded";
      header["error"] = output.cancelled ? "cancelled while running" : "";
      header["steps_done"] = output.steps_done;
      if (!output.cancelled) payload = wire::tensors_to_payload(output.outputs, header);
    } catch (const std::exception& e) {
      answer_failed(*job, e.what());
      ok = false;
      return true;
    }
    send(header, payload);
    return true;
  });
  return ok;
}

}  // namespace tessel::engine
