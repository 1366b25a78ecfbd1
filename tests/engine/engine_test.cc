// The engine with real worker processes (tests/engine/test_worker.cc, whose steps only sleep, one
// sleep per step of the whole batch): requests in order with progress, the output from rank 0 of
// two workers, cancellation of a running request, a worker killed mid-request (that request fails
// naming the worker, the next succeeds, queued requests are not lost), a worker that cannot start,
// a timeout, drain on shutdown; continuous batching (max_batch > 1): a request arriving while a
// long one runs joins within 2 steps and finishes first, the join window, cancellation of one
// request of a batch, each request's own automatic deadline in a batch, a failed begin or step, and one request at a time with max_batch 1. Step
// counts, not the wall clock, carry the assertions.
#include "tessel/engine/engine.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <thread>

#include "tessel/core/io/safetensors.h"

namespace tessel::engine {
namespace {

using std::chrono::milliseconds;

// The automatic deadline of a TestSteps request: 0.3 s for 100 steps or more (which take at least
// 2 s at 20 ms a step), else 60 s.
double test_deadline(const GenerationRequest& request) { return request.num_inference_steps >= 100 ? 0.3 : 60.0; }

ProcessorRegistry test_processors(bool with_deadline = true) {
  ProcessorRegistry processors;
  processors.add(
      "TestSteps",
      [](GenerationRequest& request) {
        if (request.width > 64) fail_argument("width", "at most 64", request.width);
      },
      [](const GenerationRequest&, const std::vector<Tensor>& outputs) {
        return std::vector<EncodedMedia>{encode_safetensors(outputs, {})};
      },
      with_deadline ? DeadlineEstimator(test_deadline) : DeadlineEstimator());
  return processors;
}

EngineConfig test_config(int step_ms, int workers = 1, bool fail_start = false, int max_batch = 1) {
  EngineConfig config;
  config.max_batch = max_batch;
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
  EXPECT_DOUBLE_EQ(snapshot->request.timeout_seconds, 0.1);
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

int64_t step_of(Engine& engine, const std::string& id) { return engine.scheduler().snapshot(id)->progress.step; }

// Two requests (seeds 1 and 2) in flight together, each past its first step.
std::pair<std::string, std::string> two_running(Engine& engine, int64_t first_steps, int64_t second_steps) {
  const std::string first = engine.submit(request(1, first_steps));
  const std::string second = engine.submit(request(2, second_steps));
  wait_for_step(engine, first, 1);
  wait_for_step(engine, second, 1);
  return {first, second};
}

// Steps the workers ran with more than one request in them.
int64_t shared_steps(const EngineStats& stats) { return stats.batch_sizes.count - stats.batch_sizes.cumulative(0); }

TEST(EngineBatching, ARequestArrivingDuringALongOneJoinsWithinTwoStepsAndFinishesFirst) {
  Engine engine(test_config(40, 1, false, 4), test_processors());
  const std::string long_id = engine.submit(request(1, 500));
  wait_for_step(engine, long_id, 2);
  const int64_t submitted_at = step_of(engine, long_id);
  const std::string short_id = engine.submit(request(2, 3));
  const auto short_done = engine.scheduler().wait(short_id, milliseconds(30000));
  const RequestSnapshot long_then = *engine.scheduler().snapshot(long_id);
  ASSERT_EQ(short_done->status, RequestStatus::kSucceeded) << short_done->output->error;
  EXPECT_EQ(first_value(*short_done), 2.0f);
  // Joined at a step boundary within 2 steps of its arrival, then stepped with the long one: done
  // after at most 3 + 2 of the long request's steps (+1: the long one's progress may run a step ahead).
  EXPECT_EQ(long_then.status, RequestStatus::kRunning);
  EXPECT_LE(long_then.progress.step - submitted_at, 3 + 2 + 1) << "the short request waited for the long one";
  EXPECT_GE(shared_steps(engine.stats()), 3);
  EXPECT_EQ(engine.stats().in_flight, 1);
  EXPECT_EQ(engine.scheduler().cancel(long_id), CancelOutcome::kCancelRequested);
  EXPECT_EQ(engine.scheduler().wait(long_id, milliseconds(10000))->status, RequestStatus::kCancelled);
}

TEST(EngineBatching, RequestsArrivingInTheJoinWindowShareTheirFirstStep) {
  EngineConfig config = test_config(5, 1, false, 3);
  config.batch_join = milliseconds(5000);  // ends early once the batch is full
  Engine engine(config, test_processors());
  std::vector<std::string> ids;
  for (uint64_t seed = 0; seed < 3; ++seed) ids.push_back(engine.submit(request(seed, 4)));
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto snapshot = engine.scheduler().wait(ids[i], milliseconds(10000));
    ASSERT_EQ(snapshot->status, RequestStatus::kSucceeded) << snapshot->output->error;
    EXPECT_EQ(first_value(*snapshot), static_cast<float>(i));  // each its own seed
    EXPECT_EQ(snapshot->output->steps_done, 4);
  }
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.batch_sizes.count, 4) << "the three requests did not step together";
  EXPECT_EQ(stats.batch_sizes.sum, 12.0);
  EXPECT_EQ(stats.steps_total, 12);
  EXPECT_EQ(stats.queue_seconds.count, 3);
}

TEST(EngineBatching, CancellingOneRequestOfABatchLeavesTheOthersRunning) {
  Engine engine(test_config(20, 1, false, 4), test_processors());
  const auto [cancelled, kept] = two_running(engine, 500, 30);
  EXPECT_EQ(engine.scheduler().cancel(cancelled), CancelOutcome::kCancelRequested);
  const auto stopped = engine.scheduler().wait(cancelled, milliseconds(10000));
  ASSERT_EQ(stopped->status, RequestStatus::kCancelled);
  EXPECT_LT(stopped->output->steps_done, 30);
  const auto finished = engine.scheduler().wait(kept, milliseconds(10000));
  ASSERT_EQ(finished->status, RequestStatus::kSucceeded) << finished->output->error;
  EXPECT_EQ(finished->output->steps_done, 30);
  EXPECT_EQ(first_value(*finished), 2.0f);
  EXPECT_EQ(engine.stats().worker_restarts, 0);
}

// Automatic deadlines: each request of a batch has its own; the one past it fails alone, its batch
// companion (which stepped with it) succeeds; without a timeout a request has none. A model type
// without a deadline estimator takes fixed timeouts only.
TEST(EngineBatching, EachRequestOfABatchHasItsOwnAutomaticDeadline) {
  EngineConfig config = test_config(20, 1, false, 4);
  config.request_timeout_auto = true;
  Engine engine(config, test_processors());
  const auto [late, kept] = two_running(engine, 500, 30);
  const auto failed = engine.scheduler().wait(late, milliseconds(10000));
  ASSERT_EQ(failed->status, RequestStatus::kFailed);
  EXPECT_NE(failed->output->error.find("timed out: past its deadline of 0.3 s"), std::string::npos) << failed->output->error;
  EXPECT_LT(failed->output->steps_done, 500);
  EXPECT_DOUBLE_EQ(failed->request.timeout_seconds, 0.3);
  const auto finished = engine.scheduler().wait(kept, milliseconds(10000));
  ASSERT_EQ(finished->status, RequestStatus::kSucceeded) << finished->output->error;
  EXPECT_EQ(finished->output->steps_done, 30);
  EXPECT_DOUBLE_EQ(finished->request.timeout_seconds, 60.0);
  EXPECT_GT(shared_steps(engine.stats()), 0);
  EXPECT_EQ(engine.stats().worker_restarts, 0);

  Engine untimed(test_config(1), test_processors());
  const std::string id = untimed.submit(request(3, 1));
  EXPECT_DOUBLE_EQ(untimed.scheduler().wait(id, milliseconds(10000))->request.timeout_seconds, 0.0);

  try {
    Engine refused(config, test_processors(false));
    FAIL() << "automatic deadlines were taken without an estimator";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("request timeout"), std::string::npos) << e.what();
  }
}

TEST(EngineBatching, AFailedBeginFailsAloneAndAFailedSharedStepFailsItsBatch) {
  Engine engine(test_config(20, 1, false, 4), test_processors());
  const std::string running = engine.submit(request(1, 40));
  wait_for_step(engine, running, 1);
  const std::string bad_begin = engine.submit(request(2, 2, "throw"));
  const auto refused = engine.scheduler().wait(bad_begin, milliseconds(10000));
  EXPECT_EQ(refused->status, RequestStatus::kFailed);
  EXPECT_NE(refused->output->error.find("the prompt asked for an error"), std::string::npos) << refused->output->error;
  EXPECT_EQ(engine.scheduler().snapshot(running)->status, RequestStatus::kRunning);
  const std::string bad_step = engine.submit(request(3, 10, "throw at 2"));
  const auto failed_step = engine.scheduler().wait(bad_step, milliseconds(10000));
  const auto shared = engine.scheduler().wait(running, milliseconds(10000));
  EXPECT_EQ(failed_step->status, RequestStatus::kFailed);
  EXPECT_EQ(shared->status, RequestStatus::kFailed);
  EXPECT_NE(shared->output->error.find("in a step shared by 2 requests"), std::string::npos) << shared->output->error;
  const std::string after = engine.submit(request(4, 2));
  EXPECT_EQ(engine.scheduler().wait(after, milliseconds(10000))->status, RequestStatus::kSucceeded);
  EXPECT_EQ(engine.stats().worker_restarts, 0);
}

TEST(EngineBatching, AKilledWorkerFailsEveryRequestOfItsBatchNamingEach) {
  Engine engine(test_config(20, 1, false, 4), test_processors());
  const auto [first, second] = two_running(engine, 500, 500);
  ASSERT_EQ(kill(engine.stats().worker_pids.at(0), SIGKILL), 0);
  for (const std::string& id : {first, second}) {
    const auto failed = engine.scheduler().wait(id, milliseconds(10000));
    ASSERT_EQ(failed->status, RequestStatus::kFailed);
    EXPECT_NE(failed->output->error.find("killed by signal 9"), std::string::npos) << failed->output->error;
    EXPECT_NE(failed->output->error.find(id), std::string::npos) << failed->output->error;
  }
  const std::string next = engine.submit(request(3, 2));
  EXPECT_EQ(engine.scheduler().wait(next, milliseconds(10000))->status, RequestStatus::kSucceeded);
}

TEST(EngineBatching, MaxBatchOneRunsOneRequestAtATime) {
  Engine engine(test_config(5, 1, false, 1), test_processors());
  const std::string first = engine.submit(request(1, 30));
  wait_for_step(engine, first, 1);
  const std::string second = engine.submit(request(2, 3));
  const auto second_done = engine.scheduler().wait(second, milliseconds(10000));
  ASSERT_EQ(second_done->status, RequestStatus::kSucceeded);
  // The second waited in the queue until the first was answered.
  EXPECT_EQ(engine.scheduler().snapshot(first)->status, RequestStatus::kSucceeded);
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.batch_sizes.cumulative(0), stats.batch_sizes.count);  // every step ran one request
  EXPECT_EQ(stats.batch_sizes.count, 33);
}

TEST(EngineBatching, BadBatchSettingsAreErrorsNamingThem) {
  for (int bad : {0, 65}) {
    try {
      Engine engine(test_config(1, 1, false, bad), test_processors());
      ADD_FAILURE() << "max_batch " << bad << " was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("max_batch"), std::string::npos) << e.what();
    }
  }
  try {
    Engine engine(test_config(1, 2, false, 2), test_processors());
    ADD_FAILURE() << "a group took max_batch 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_batch: expected 1 with a group of 2 workers"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel::engine
