// The worker program of the engine tests: run_worker with a runner of model type "TestSteps"
// whose denoising steps only sleep (one sleep per step of the whole batch, as a shared forward),
// so the tests control timing, crashes, batching and cancellation without a model. Config JSON:
// {"step_ms": N, "fail_start": bool}. Prompts: "throw" fails begin, "throw at N" fails step N.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessel/core/error.h"
#include "tessel/engine/worker.h"

namespace {

using namespace tessel;
using namespace tessel::engine;

struct SleepingJob final : RunnerJob {
  GenerationRequest request;
  RunControl control;
  int64_t steps_done = 0;
  bool cancelled = false;
  bool done() const override { return cancelled || steps_done >= request.num_inference_steps * request.num_outputs; }
};

class SleepingRunner final : public PipelineRunner {
 public:
  explicit SleepingRunner(const RunnerSetup& setup) : rank_(setup.rank) {
    const nlohmann::json config = nlohmann::json::parse(setup.config_json);
    step_ms_ = config.value("step_ms", 1);
    if (config.value("fail_start", false)) throw Error("TestSteps: fail_start was asked for");
  }

  std::unique_ptr<RunnerJob> begin(const GenerationRequest& request, const RunControl& control) override {
    if (request.prompt == "throw") throw Error("TestSteps: the prompt asked for an error");
    auto job = std::make_unique<SleepingJob>();
    job->request = request;
    job->control = control;
    return job;
  }

  // One sleep per call, however many jobs step in it (as a batched forward), then a step of each;
  // a job whose prompt is "throw at N" makes the call fail at its step N.
  void step(std::span<RunnerJob* const> jobs) override {
    std::vector<SleepingJob*> stepping;
    for (RunnerJob* runner_job : jobs) {
      auto& job = static_cast<SleepingJob&>(*runner_job);
      if (job.done()) continue;
      if (job.control.cancel != nullptr && job.control.cancel->load()) job.cancelled = true;
      else stepping.push_back(&job);
    }
    if (stepping.empty()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms_));
    for (SleepingJob* job : stepping) {
      ++job->steps_done;
      if (job->request.prompt == "throw at " + std::to_string(job->steps_done)) throw Error("TestSteps: a step asked for an error");
      const int64_t total = job->request.num_inference_steps * job->request.num_outputs;
      RequestProgress progress;
      progress.step = job->steps_done;
      progress.total_steps = total;
      progress.step_seconds = step_ms_ / 1000.0;
      progress.eta_seconds = static_cast<double>(total - job->steps_done) * step_ms_ / 1000.0;
      if (job->control.on_progress) job->control.on_progress(progress);
    }
  }

  // The output: one fp32 tensor of `width` values per output, all equal to seed + output index + rank.
  RunnerOutput finish(RunnerJob& runner_job) override {
    auto& job = static_cast<SleepingJob&>(runner_job);
    RunnerOutput output;
    output.steps_done = job.steps_done;
    output.cancelled = job.cancelled;
    if (job.cancelled) return output;
    for (int64_t i = 0; i < job.request.num_outputs; ++i) {
      Tensor tensor = Tensor::empty({job.request.width}, DType::kF32);
      for (int64_t j = 0; j < job.request.width; ++j)
        tensor.data_as<float>()[j] = static_cast<float>(job.request.seed + static_cast<uint64_t>(i) + static_cast<uint64_t>(rank_));
      output.outputs.push_back(std::move(tensor));
    }
    return output;
  }

 private:
  int rank_ = 0;
  int step_ms_ = 1;
};

}  // namespace

int main(int argc, char** argv) {
  WorkerArgs args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--channel") args.channel = argv[i + 1];
    else if (flag == "--rank") args.rank = std::atoi(argv[i + 1]);
  }
  RunnerRegistry runners;
  runners.add("TestSteps", [](const RunnerSetup& setup) { return std::make_unique<SleepingRunner>(setup); });
  try {
    return run_worker(args, runners);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine_test_worker: %s\n", e.what());
    return 2;
  }
}
