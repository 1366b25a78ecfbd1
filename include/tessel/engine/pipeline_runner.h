// What a worker process runs: a PipelineRunner turns GenerationRequests into raw output tensors
// (latents or frames) for its model type, step by step (begin, step, finish) so that the worker can
// keep several requests in flight and step them together; it reports progress after every
// denoising step and stops a request between steps when cancelled. Runners are made by a
// RunnerRegistry keyed by the model type (the `_class_name` of a diffusers model_index.json), so
// the engine and its workers never name a model.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessel/core/tensor.h"
#include "tessel/engine/request.h"

namespace tessel::engine {

struct RunnerOutput {
  // The outputs of the request in order (num_outputs of them), each as the model type's
  // post-processor expects it; the latents (1, C, F, H, W) fp32 for a model without a VAE.
  std::vector<Tensor> outputs;
  int64_t steps_done = 0;
  bool cancelled = false;
};

struct RunControl {
  const std::atomic<bool>* cancel = nullptr;  // read between steps
  std::function<void(const RequestProgress&)> on_progress;  // after every step (rank 0 forwards it)
};

// One request in flight on a runner, from begin to finish.
class RunnerJob {
 public:
  virtual ~RunnerJob() = default;
  // Every step ran, or the job saw its cancel flag before a step (it then runs no more steps).
  virtual bool done() const = 0;
};

class PipelineRunner {
 public:
  virtual ~PipelineRunner() = default;
  // Checks the request (already pre-processed by the engine) and prepares it (text encoding,
  // latents); runs no step. `control` (and the flag it points to) outlives the job. Throws Error
  // when it cannot.
  virtual std::unique_ptr<RunnerJob> begin(const GenerationRequest& request, const RunControl& control) = 0;
  // The next denoising step of every job that is not done (jobs of this runner, each once): jobs
  // that can share a forward share it. A job whose cancel flag is set runs no step and is done
  // (cancelled). Throws Error when a step fails: every job of that call is then to be taken as failed.
  virtual void step(std::span<RunnerJob* const> jobs) = 0;
  // The job's outputs (decoded when the model has a VAE, unless cancelled); the job is spent.
  virtual RunnerOutput finish(RunnerJob& job) = 0;
  // One request alone: begin, step until done, finish.
  RunnerOutput run(const GenerationRequest& request, const RunControl& control);
};

// Where and how a worker runs: its rank in the parallel group and the app's configuration of the
// runner (JSON text the engine hands every worker unchanged, e.g. sparse-attention settings).
struct RunnerSetup {
  std::string model_dir;
  int rank = 0;
  int world_size = 1;
  std::string config_json = "{}";
  // With more than one worker: the ShmWorld the group's processes join (make_shm_communicator), made
  // by the WorkerGroup for each start of the group; empty for one worker.
  std::string group_world;
};

using RunnerFactory = std::function<std::unique_ptr<PipelineRunner>(const RunnerSetup& setup)>;

class RunnerRegistry {
 public:
  // Replaces an earlier factory of the same model type.
  void add(const std::string& model_type, RunnerFactory factory);
  // Throws Error naming the model type and the registered ones when none is registered.
  std::unique_ptr<PipelineRunner> make(const std::string& model_type, const RunnerSetup& setup) const;
  std::vector<std::string> model_types() const;

 private:
  std::map<std::string, RunnerFactory> factories_;
};

// The `_class_name` of DIR/model_index.json. Throws Error naming the file when it is missing or
// not a JSON object with a string `_class_name`.
std::string read_model_type(const std::string& model_dir);

}  // namespace tessel::engine
