// The worker program of the engine tests: run_worker with a runner of model type "TestSteps"
// whose denoising steps only sleep, so the tests control timing, crashes and cancellation
// without a model. Config JSON: {"step_ms": N, "fail_start": bool}.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tessel/core/error.h"
#include "tessel/engine/worker.h"

namespace {

using namespace tessel;
using namespace tessel::engine;

class SleepingRunner final : public PipelineRunner {
 public:
  explicit SleepingRunner(const RunnerSetup& setup) : rank_(setup.rank) {
    const nlohmann::json config = nlohmann::json::parse(setup.config_json);
    step_ms_ = config.value("step_ms", 1);
    if (config.value("fail_start", false)) throw Error("TestSteps: fail_start was asked for");
  }

  // The output: one fp32 tensor of `width` values, all equal to seed + output index + rank.
  RunnerOutput run(const GenerationRequest& request, const RunControl& control) override {
    if (request.prompt == "throw") throw Error("TestSteps: the prompt asked for an error");
    RunnerOutput output;
    const int64_t total = request.num_inference_steps * request.num_outputs;
    for (int64_t i = 0; i < request.num_outputs; ++i) {
      for (int64_t step = 0; step < request.num_inference_steps; ++step) {
        if (control.cancel != nullptr && control.cancel->load()) {
          output.cancelled = true;
          return output;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(step_ms_));
        ++output.steps_done;
        RequestProgress progress;
        progress.step = output.steps_done;
        progress.total_steps = total;
        progress.step_seconds = step_ms_ / 1000.0;
        progress.eta_seconds = static_cast<double>(total - output.steps_done) * step_ms_ / 1000.0;
        if (control.on_progress) control.on_progress(progress);
      }
      Tensor tensor = Tensor::empty({request.width}, DType::kF32);
      for (int64_t j = 0; j < request.width; ++j)
        tensor.data_as<float>()[j] = static_cast<float>(request.seed + static_cast<uint64_t>(i) + static_cast<uint64_t>(rank_));
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
