// The bounded FIFO: order, the depth limit, cancellation while queued and running, exactly one
// final answer per request, progress, forgetting and the bound on kept final states, shutdown.
#include "tessel/engine/request_scheduler.h"

#include <gtest/gtest.h>

#include <thread>

namespace tessel::engine {
namespace {

using std::chrono::milliseconds;

GenerationRequest request_with_prompt(const std::string& prompt) {
  GenerationRequest request;
  request.prompt = prompt;
  return request;
}

GenerationOutput succeeded() { return GenerationOutput{}; }

TEST(RequestScheduler, RunsInSubmissionOrderAndRefusesBeyondTheDepth) {
  RequestScheduler scheduler(2, 16);
  const std::string a = scheduler.submit(request_with_prompt("a"));
  const std::string b = scheduler.submit(request_with_prompt("b"), "video");
  EXPECT_EQ(b.rfind("video-", 0), 0u);
  EXPECT_THROW(scheduler.submit(request_with_prompt("c")), QueueFullError);
  EXPECT_EQ(scheduler.counts().rejected_queue_full, 1);
  EXPECT_EQ(scheduler.snapshot(b)->queue_position, 1);
  auto first = scheduler.next(milliseconds(10));
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->request.prompt, "a");
  EXPECT_EQ(scheduler.snapshot(a)->status, RequestStatus::kRunning);
  scheduler.submit(request_with_prompt("c"));  // the running request does not count against the depth
  EXPECT_EQ(scheduler.next(milliseconds(10))->request.prompt, "b");
}

TEST(RequestScheduler, EachRequestGetsExactlyOneFinalAnswer) {
  RequestScheduler scheduler(4, 16);
  const std::string id = scheduler.submit(request_with_prompt("a"));
  EXPECT_FALSE(scheduler.finish(id, succeeded()));  // not running yet
  auto running = scheduler.next(milliseconds(10));
  RequestProgress progress;
  progress.step = 3;
  progress.total_steps = 10;
  scheduler.report_progress(id, progress);
  EXPECT_EQ(scheduler.snapshot(id)->progress.step, 3);
  EXPECT_TRUE(scheduler.finish(id, succeeded()));
  GenerationOutput failure;
  failure.status = RequestStatus::kFailed;
  EXPECT_FALSE(scheduler.finish(id, failure));
  EXPECT_EQ(scheduler.snapshot(id)->status, RequestStatus::kSucceeded);
  EXPECT_EQ(scheduler.cancel(id), CancelOutcome::kAlreadyFinished);
  EXPECT_EQ(scheduler.counts().succeeded, 1);
  EXPECT_EQ(scheduler.counts().failed, 0);
}

TEST(RequestScheduler, CancelsQueuedAtOnceAndRunningBySignal) {
  RequestScheduler scheduler(4, 16);
  const std::string running_id = scheduler.submit(request_with_prompt("a"));
  const std::string queued_id = scheduler.submit(request_with_prompt("b"));
  auto running = scheduler.next(milliseconds(10));
  EXPECT_EQ(scheduler.cancel(queued_id), CancelOutcome::kCancelledWhileQueued);
  EXPECT_EQ(scheduler.snapshot(queued_id)->status, RequestStatus::kCancelled);
  EXPECT_EQ(scheduler.cancel(running_id), CancelOutcome::kCancelRequested);
  EXPECT_TRUE(running->cancel_requested.load());
  EXPECT_EQ(scheduler.cancel("req-999"), CancelOutcome::kNotFound);
  EXPECT_EQ(scheduler.next(milliseconds(10)), nullptr);  // the cancelled one never runs
}

TEST(RequestScheduler, WaitReturnsWhenTheAnswerArrives) {
  RequestScheduler scheduler(4, 16);
  const std::string id = scheduler.submit(request_with_prompt("a"));
  std::thread worker([&] {
    auto running = scheduler.next(milliseconds(1000));
    std::this_thread::sleep_for(milliseconds(20));
    scheduler.finish(running->request.id, succeeded());
  });
  const auto snapshot = scheduler.wait(id, milliseconds(5000));
  worker.join();
  ASSERT_TRUE(snapshot.has_value());
  EXPECT_EQ(snapshot->status, RequestStatus::kSucceeded);
  ASSERT_NE(snapshot->output, nullptr);
  EXPECT_EQ(scheduler.wait("req-404", milliseconds(1)), std::nullopt);
}

TEST(RequestScheduler, KeepsABoundedNumberOfFinalStates) {
  RequestScheduler scheduler(8, 2);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(scheduler.submit(request_with_prompt("x")));
    scheduler.finish(scheduler.next(milliseconds(10))->request.id, succeeded());
  }
  EXPECT_FALSE(scheduler.snapshot(ids[0]).has_value());  // the oldest final state was dropped
  EXPECT_TRUE(scheduler.snapshot(ids[2]).has_value());
  scheduler.forget(ids[2]);
  EXPECT_FALSE(scheduler.snapshot(ids[2]).has_value());
}

TEST(RequestScheduler, ShutdownRefusesNewWorkAndCancelsTheQueue) {
  RequestScheduler scheduler(4, 16);
  const std::string id = scheduler.submit(request_with_prompt("a"));
  scheduler.stop_accepting();
  EXPECT_THROW(scheduler.submit(request_with_prompt("b")), NotAcceptingError);
  scheduler.cancel_queued("shutting down");
  const auto snapshot = scheduler.snapshot(id);
  EXPECT_EQ(snapshot->status, RequestStatus::kCancelled);
  EXPECT_EQ(snapshot->output->error, "shutting down");
  scheduler.close();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(scheduler.next(milliseconds(5000)), nullptr);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
  EXPECT_THROW(RequestScheduler(0, 1), Error);
}

}  // namespace
}  // namespace tessel::engine
