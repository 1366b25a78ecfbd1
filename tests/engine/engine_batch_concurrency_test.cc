// Continuous batching under concurrent clients (the ThreadSanitizer stage runs *_concurrency_test
// files): 8 threads submit, poll and cancel requests while the engine's dispatch thread keeps the
// worker's batch full and its post-process thread answers; every accepted request ends with exactly
// one final answer, and the engine's counts add up. Also the post-process thread alone: tasks posted
// from several threads each run once, and finish() runs what was posted before it returns.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "task_thread.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/engine/engine.h"

namespace tessel::engine {
namespace {

using std::chrono::milliseconds;

TEST(EngineBatchConcurrency, EveryRequestOfConcurrentClientsGetsOneAnswer) {
  ProcessorRegistry processors;
  processors.add("TestSteps", [](GenerationRequest&) {},
                 [](const GenerationRequest&, const std::vector<Tensor>& outputs) {
                   return std::vector<EncodedMedia>{encode_safetensors(outputs, {})};
                 });
  EngineConfig config;
  config.model_type = "TestSteps";
  config.worker_command = {std::string(TESSEL_BINARY_DIR) + "/bin/engine_test_worker"};
  config.max_queue = 16;
  config.max_batch = 4;
  config.runner_config_json = R"({"step_ms": 2})";
  config.worker_start_timeout = milliseconds(10000);
  Engine engine(config, std::move(processors));
  constexpr int kClients = 8, kPerClient = 12;
  std::atomic<int> accepted{0}, refused{0}, final_answers{0}, cancel_asked{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < kPerClient; ++i) {
        GenerationRequest request;
        request.prompt = "p";
        request.width = 4;
        request.seed = static_cast<uint64_t>(c * 100 + i);
        request.num_inference_steps = 1 + (c + i) % 5;
        std::string id;
        try {
          id = engine.submit(request);
        } catch (const QueueFullError&) {
          ++refused;
          continue;
        }
        ++accepted;
        // A third cancelled at once (most while queued), a third once running (in the batch).
        if ((c + i) % 3 == 1)
          for (int poll = 0; poll < 5000 && engine.scheduler().snapshot(id)->status == RequestStatus::kQueued; ++poll)
            std::this_thread::sleep_for(milliseconds(1));
        if ((c + i) % 3 != 2 && engine.scheduler().cancel(id) == CancelOutcome::kCancelRequested) ++cancel_asked;
        const auto snapshot = engine.scheduler().wait(id, milliseconds(30000));
        if (snapshot && is_final(snapshot->status)) ++final_answers;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(accepted + refused, kClients * kPerClient);
  EXPECT_EQ(final_answers.load(), accepted.load());
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.counts.succeeded + stats.counts.failed + stats.counts.cancelled, accepted.load());
  EXPECT_EQ(stats.counts.failed, 0);
  EXPECT_EQ(stats.counts.rejected_queue_full, refused.load());
  EXPECT_LE(stats.batch_sizes.sum, static_cast<double>(stats.steps_total));
  EXPECT_EQ(stats.in_flight, 0);
  std::printf("accepted %d, refused %d, cancels asked while running %d; %lld steps in %lld batch steps\n", accepted.load(), refused.load(),
              cancel_asked.load(), static_cast<long long>(stats.steps_total), static_cast<long long>(stats.batch_sizes.count));
}

TEST(EngineBatchConcurrency, TheTaskThreadRunsEveryPostedTaskOnceAndFinishRunsThemAll) {
  std::vector<int> order;
  TaskThread thread;
  std::vector<std::thread> posters;
  std::atomic<int> posted{0};
  for (int p = 0; p < 4; ++p)
    posters.emplace_back([&] {
      for (int i = 0; i < 100; ++i) thread.post([&order, value = posted++] { order.push_back(value); });
    });
  for (std::thread& t : posters) t.join();
  thread.finish();
  ASSERT_EQ(order.size(), 400u);
  std::vector<bool> seen(400, false);
  for (int value : order) seen.at(static_cast<size_t>(value)) = true;
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), 400);
  thread.post([&order] { order.push_back(-1); });  // after finish: on the caller's thread
  EXPECT_EQ(order.back(), -1);
}

}  // namespace
}  // namespace tessel::engine
