// A worker's requests in flight: continuous (step-level) batching on the worker's side. Between
// two steps the worker admits the requests the engine sent meanwhile (begin), drops the cancelled
// ones, steps all the others in one call of its runner (which makes one forward of those that can
// share it), and finishes and answers each request as soon as its own steps are done. Each
// request is answered exactly once, by rank 0, under its own sequence number.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/engine/message_queue.h"
#include "tessel/engine/pipeline_runner.h"
#include "wire_format.h"
#include "worker_channel.h"

namespace tessel::engine {

class WorkerBatch {
 public:
  // `results` is rank 0's queue to the engine (null on the other ranks, which answer nothing).
  // `parent` is the engine's pid: a worker whose engine died stops waiting to send to it.
  WorkerBatch(PipelineRunner& runner, WorkerControlBlock& control, MessageQueue* results, int rank, int world_size, pid_t parent);

  bool empty() const { return jobs_.empty(); }
  // Begins the requests of a "generate" message. False when a begin threw: that request alone was
  // answered as failed (the others go on).
  bool admit(const wire::Message& message);
  // One step of the batch. One process first lets the cancelled requests leave (answered at once,
  // with no step run for them); a group's ranks decide cancellation together inside the runner's
  // step. Then one runner step for the rest, and every request done is finished and answered.
  // False when a step or a finish threw: a failed step fails every request of that step (their
  // forward may have been one: no request can be told apart as the cause), a failed finish only its own.
  bool step();

 private:
  struct Job {
    uint64_t seq = 0;
    int lane = 0;
    std::string id;
    std::atomic<bool> cancel{false};  // the engine's cancel of this request, copied from its lane
    std::unique_ptr<RunnerJob> runner_job;
  };
  bool admit_one(const nlohmann::json& entry, std::string_view payload);
  void refresh_cancel(Job& job) const;
  void send_progress(const Job& job, RequestProgress progress) const;
  void answer_failed(const Job& job, const std::string& error) const;
  // Finishes and answers every job that is done; false when a finish threw.
  bool answer_done();
  void send(const nlohmann::json& header, const std::string& payload = {}) const;
  std::vector<RunnerJob*> runner_jobs(bool cancelled) const;

  PipelineRunner& runner_;
  WorkerControlBlock& control_;
  MessageQueue* results_;
  int rank_;
  int world_size_;
  pid_t parent_;
  std::vector<std::unique_ptr<Job>> jobs_;  // admission order; unique_ptr: the runner keeps &cancel
};

}  // namespace tessel::engine
