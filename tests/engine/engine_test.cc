// The engine with real worker processes (tests/engine/test_worker.cc, whose steps only sleep):
// requests in order with progress, the output from rank 0 of two workers, cancellation of a
// running request, a worker killed mid-request (that request fails naming the worker, the next
// succeeds, queued requests are not lost), a worker that cannot start, a timeout, drain on shutdown.
#include "tessel/engine/engine.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <thread>

#include "tessel/core/io/safetensors.h"

namespace tessel::engine {
namespace {

using std::chrono::milliseconds;

ProcessorRegistry test_processors() {
  ProcessorRegistry processors;
  processors.add(
      "TestSteps",
      [](GenerationRequest& request) {
        if (request.width > 64) fail_argument("width", "at most 64", request.width);
      },
      [](const GenerationRequest&, const std::vector<Tensor>& outputs) {
        return std::vector<EncodedMedia>{encode_safetensors(outputs, {})};
      });
  return processors;
}

EngineConfig test_config(int step_ms, int workers = 1, bool fail_start = false) {
  EngineConfig config;
  config.model_type = "TestSteps";
  config.worker_command = {std::string(TESSEL_BINARY_DIR) + "/bin/engine_test_worker"};
  config.num_workers = workers;
  config.max_queue = 4;
  config.runner_config_json = "{\"step_ms\": " + std::to_string(step_ms) + (fail_start ? ", \"fail_start\": true}" : "}");
  config.worker_start_timeout = milliseconds(10000);
  return config;
}

GenerationRequest request(uint64_t seed, int64_t steps = 2, const std::string& prompt = "p") {
  GenerationRequest r;
  r.prompt = prompt;
  r.width = 4;
  r.seed = seed;
  r.num_inference_steps = steps;
  return r;
}

// The first value of the request's encoded output (the test worker fills seed + output + rank).
float first_value(const RequestSnapshot& snapshot) {
  const std::string path = ::testing::TempDir() + "/engine_output_" + std::to_string(getpid()) + ".safetensors";
  {
    std::FILE* file = std::fopen(path.c_str(), "wb");
    std::fwrite(snapshot.output->media.at(0).bytes.data(), 1, snapshot.output->media.at(0).bytes.size(), file);
    std::fclose(file);
  }
  return SafetensorsFile::open(path).load("output_0").data_as<float>()[0];
}

// Waits until the request reported at least `step` steps.
void wait_for_step(Engine& engine, const std::string& id, int64_t step) {
  for (int i = 0; i < 5000; ++i) {
    const auto snapshot = engine.scheduler().snapshot(id);
    if (snapshot && snapshot->progress.step >= step) return;
    std::this_thread::sleep_for(milliseconds(1));
  }
  FAIL() << "request " << id << " never reached step " << step;
}

TEST(Engine, RunsRequestsInOrderWithProgressAndRankZerosOutput) {
  Engine engine(test_config(1, 2), test_processors());
  ASSERT_EQ(engine.stats().worker_pids.size(), 2u);
  std::vector<std::string> ids;
  for (uint64_t seed = 10; seed < 13; ++seed) ids.push_back(engine.submit(request(seed, 3)));
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto snapshot = engine.scheduler().wait(ids[i], milliseconds(10000));
    ASSERT_TRUE(snapshot.has_value());
    ASSERT_EQ(snapshot->status, RequestStatus::kSucceeded) << snapshot->output->error;
    EXPECT_EQ(snapshot->progress.step, 3);
    EXPECT_EQ(snapshot->progress.total_steps, 3);
    EXPECT_EQ(first_value(*snapshot), static_cast<float>(10 + i));  // rank 0's (rank 1 would add 1)
  }
  EXPECT_EQ(engine.stats().counts.succeeded, 3);
  EXPECT_EQ(engine.stats().steps_total, 9);
  GenerationRequest too_wide = request(1);
  too_wide.width = 65;
  EXPECT_THROW(engine.submit(too_wide), Error);  // refused by pre-processing, never queued
}

TEST(Engine, CancelsARunningRequestBetweenSteps) {
  Engine engine(test_config(20), test_processors());
  const std::string id = engine.submit(request(1, 500));
  wait_for_step(engine, id, 1);
  EXPECT_EQ(engine.scheduler().cancel(id), CancelOutcome::kCancelRequested);
  const auto snapshot = engine.scheduler().wait(id, milliseconds(5000));
  ASSERT_EQ(snapshot->status, RequestStatus::kCancelled);
  EXPECT_LT(snapshot->output->steps_done, 100);
  const std::string next = engine.submit(request(2));
  EXPECT_EQ(engine.scheduler().wait(next, milliseconds(5000))->status, RequestStatus::kSucceeded);
}

TEST(Engine, AKilledWorkerFailsItsRequestAndTheNextSucceeds) {
  Engine engine(test_config(20), test_processors());
  const std::string victim = engine.submit(request(1, 500));
  const std::string queued = engine.submit(request(2, 2));
  wait_for_step(engine, victim, 1);
  const pid_t pid = engine.stats().worker_pids.at(0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  const auto failed = engine.scheduler().wait(victim, milliseconds(10000));
  ASSERT_EQ(failed->status, RequestStatus::kFailed);
  EXPECT_NE(failed->output->error.find("killed by signal 9"), std::string::npos) << failed->output->error;
  EXPECT_NE(failed->output->error.find(victim), std::string::npos) << failed->output->error;
  const auto after = engine.scheduler().wait(queued, milliseconds(10000));  // queued before the crash, not lost
  ASSERT_EQ(after->status, RequestStatus::kSucceeded) << after->output->error;
  EXPECT_EQ(first_value(*after), 2.0f);
  EXPECT_EQ(engine.stats().worker_restarts, 1);
  EXPECT_NE(engine.stats().worker_pids.at(0), pid);
  EXPECT_TRUE(engine.stats().healthy);
}

TEST(Engine, ARunnerErrorFailsOnlyThatRequest) {
  Engine engine(test_config(1), test_processors());
  const std::string bad = engine.submit(request(1, 2, "throw"));
  const std::string good = engine.submit(request(2, 2));
  const auto failed = engine.scheduler().wait(bad, milliseconds(5000));
  EXPECT_EQ(failed->status, RequestStatus::kFailed);
  EXPECT_NE(failed->output->error.find("the prompt asked for an error"), std::string::npos);
  EXPECT_EQ(engine.scheduler().wait(good, milliseconds(5000))->status, RequestStatus::kSucceeded);
  EXPECT_EQ(engine.stats().worker_restarts, 0);
}

TEST(Engine, AWorkerThatCannotStartIsAnErrorWithItsMessage) {
  try {
    Engine engine(test_config(1, 1, true), test_processors());
    FAIL() << "the engine started";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fail_start was asked for"), std::string::npos) << e.what();
  }
  EngineConfig missing = test_config(1);
  missing.worker_command = {"/nonexistent/tessel-worker"};
  EXPECT_THROW(Engine(missing, test_processors()), Error);
}

TEST(Engine, ARequestPastItsTimeoutIsStoppedAndFails) {
  EngineConfig config = test_config(20);
  config.request_timeout = milliseconds(100);
  Engine engine(config, test_processors());
  const std::string id = engine.submit(request(1, 500));
  const auto snapshot = engine.scheduler().wait(id, milliseconds(5000));
  ASSERT_EQ(snapshot->status, RequestStatus::kFailed);
  EXPECT_NE(snapshot->output->error.find("timed out"), std::string::npos) << snapshot->output->error;
}

TEST(Engine, DrainingShutdownFinishesQueuedWorkAndRefusesNew) {
  Engine engine(test_config(5), test_processors());
  std::vector<std::string> ids;
  for (uint64_t seed = 0; seed < 3; ++seed) ids.push_back(engine.submit(request(seed, 3)));
  engine.shutdown(ShutdownMode::kDrain);
  for (const std::string& id : ids) EXPECT_EQ(engine.scheduler().snapshot(id)->status, RequestStatus::kSucceeded);
  EXPECT_THROW(engine.submit(request(9)), NotAcceptingError);
  for (int pid : engine.stats().worker_pids) EXPECT_EQ(pid, -1);  // every worker exited and was reaped
}

}  // namespace
}  // namespace tessel::engine
