// The engine's batch dispatcher of batch_dispatcher.h.
#include "batch_dispatcher.h"

#include <algorithm>

#include "tessel/core/error.h"
#include "worker_channel.h"

namespace tessel::engine {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kIdlePoll{100};   // an idle group's wait for a request
constexpr milliseconds kReplyPoll{20};   // a busy group's wait for a reply, between supervision rounds
constexpr int kMaxRepliesPerRound = 256;  // then cancellations and health again, however busy rank 0 is

WorkerOutcome failed(std::string error) {
  WorkerOutcome outcome;
  outcome.error = std::move(error);
  return outcome;
}

}  // namespace

BatchDispatcher::BatchDispatcher(DispatchSettings settings, RequestScheduler& scheduler, WorkerGroup& workers, DispatchHooks hooks)
    : settings_(settings), scheduler_(scheduler), workers_(workers), hooks_(std::move(hooks)), lane_taken_(settings.max_batch, false) {
  if (settings_.max_batch < 1 || settings_.max_batch > kMaxBatchLanes)
    fail_argument("max_batch", detail::concat("1..", kMaxBatchLanes), settings_.max_batch);
  if (settings_.batch_join.count() < 0) fail_argument("batch_join", ">= 0 ms", settings_.batch_join.count());
}

bool BatchDispatcher::run_once() {
  admit();
  if (in_flight_.empty()) return false;
  try {
    take_replies();
  } catch (const std::exception& e) {  // a broken message: no request can be told apart, none is left waiting
    const std::string error = std::string("engine error: ") + e.what();
    fail_all([&](const std::string&) { return error; });
    workers_.restart(error);
    return true;
  }
  supervise();
  return true;
}

void BatchDispatcher::admit() {
  const size_t max_batch = static_cast<size_t>(settings_.max_batch);
  std::vector<std::shared_ptr<RunningRequest>> joining;
  if (in_flight_.empty()) {
    std::shared_ptr<RunningRequest> first = scheduler_.next(kIdlePoll);
    if (!first) return;
    joining.push_back(std::move(first));
    // An idle group waits up to the join window for companions, so that requests arriving together
    // share their first step instead of the first running a step alone.
    const Clock::time_point until = Clock::now() + settings_.batch_join;
    while (joining.size() < max_batch) {
      const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
      if (left.count() <= 0) break;
      std::shared_ptr<RunningRequest> next = scheduler_.next(left);
      if (!next) break;
      joining.push_back(std::move(next));
    }
  }
  while (in_flight_.size() + joining.size() < max_batch) {
    std::shared_ptr<RunningRequest> running = scheduler_.next(milliseconds(0));
    if (!running) break;
    joining.push_back(std::move(running));
  }
  if (!joining.empty()) start(std::move(joining));
}

void BatchDispatcher::start(std::vector<std::shared_ptr<RunningRequest>> joining) {
  std::vector<std::shared_ptr<RunningRequest>> sending;
  for (auto& running : joining) {
    if (hooks_.on_admit) hooks_.on_admit(*running);
    if (running->cancel_requested.load()) {  // cancelled during the join window: it never reaches the workers
      WorkerOutcome outcome;
      outcome.status = RequestStatus::kCancelled;
      outcome.error = "cancelled before its first step";
      hooks_.on_outcome(std::move(running), std::move(outcome));
    } else {
      sending.push_back(std::move(running));
    }
  }
  if (sending.empty()) return;
  if (!workers_.healthy() && !workers_.check_health()) {
    for (auto& running : sending) hooks_.on_outcome(std::move(running), failed("no workers are running: " + workers_.last_error()));
    return;
  }
  std::vector<WorkerGroup::SentRequest> sent;
  for (size_t lane = 0; lane < lane_taken_.size() && sent.size() < sending.size(); ++lane)
    if (!lane_taken_[lane]) sent.push_back({&sending[sent.size()]->request, static_cast<int>(lane)});
  const uint64_t first_seq = workers_.send_requests(sent);
  if (first_seq == 0) {  // the group took nothing within the send timeout and was restarted: its requests went with it
    const std::string reason = "the workers took no request within 5 s; the group was restarted";
    fail_all([&](const std::string&) { return reason; });
    for (auto& running : sending) hooks_.on_outcome(std::move(running), failed(reason));
    return;
  }
  for (size_t i = 0; i < sending.size(); ++i) {
    InFlight entry;
    entry.lane = sent[i].lane;
    const double timeout = sending[i]->request.timeout_seconds;
    entry.deadline = timeout > 0.0 ? sending[i]->started_at + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout))
                                   : Clock::time_point::max();
    entry.running = std::move(sending[i]);
    lane_taken_[entry.lane] = true;
    in_flight_.emplace(first_seq + i, std::move(entry));
  }
  in_flight_count_ = static_cast<int64_t>(in_flight_.size());
}

void BatchDispatcher::take_replies() {
  for (int i = 0; i < kMaxRepliesPerRound && !in_flight_.empty(); ++i) {
    std::optional<WorkerReply> reply = workers_.receive(i == 0 ? kReplyPoll : milliseconds(0));
    if (!reply) return;
    if (reply->kind == WorkerReply::kStep) {
      if (hooks_.on_step) hooks_.on_step(reply->batch_size, reply->step_seconds);
      continue;
    }
    const auto it = in_flight_.find(reply->seq);
    if (it == in_flight_.end()) continue;  // a request already failed by the engine: a late message
    if (reply->kind == WorkerReply::kProgress) {
      if (hooks_.on_progress) hooks_.on_progress(it->second.running->request.id, reply->progress);
      continue;
    }
    if (it->second.timed_out && reply->outcome.status == RequestStatus::kCancelled) {
      reply->outcome.status = RequestStatus::kFailed;
      reply->outcome.error = detail::concat("timed out: past its deadline of ", it->second.running->request.timeout_seconds,
                                            " s, stopped after ", reply->outcome.steps_done, " steps");
    }
    answer(reply->seq, std::move(reply->outcome));
  }
}

void BatchDispatcher::supervise() {
  const Clock::time_point now = Clock::now();
  for (auto& [seq, entry] : in_flight_) {
    if (!entry.timed_out && now > entry.deadline) entry.timed_out = true;
    if (entry.running->cancel_requested.load() || entry.timed_out) workers_.cancel(seq, entry.lane);
    if (entry.timed_out && now > entry.deadline + workers_.config().stuck_grace) {
      const std::string stuck = entry.running->request.id;
      const std::string grace = std::to_string(workers_.config().stuck_grace.count());
      fail_all([&](const std::string& id) {
        return id == stuck ? "timed out, and the workers did not stop within " + grace + " ms of the cancellation; the group was restarted"
                           : "request " + stuck + " left the workers stuck; the group was restarted";
      });
      workers_.restart("request " + stuck + " left the workers stuck");
      return;
    }
  }
  if (const std::string failure = workers_.running_failure(); !failure.empty()) {
    fail_all([&](const std::string& id) { return failure + " while running request " + id; });
    workers_.restart(failure);
  }
}

void BatchDispatcher::answer(uint64_t seq, WorkerOutcome outcome) {
  const auto it = in_flight_.find(seq);
  std::shared_ptr<RunningRequest> running = std::move(it->second.running);
  lane_taken_[it->second.lane] = false;
  in_flight_.erase(it);
  in_flight_count_ = static_cast<int64_t>(in_flight_.size());
  hooks_.on_outcome(std::move(running), std::move(outcome));
}

void BatchDispatcher::fail_all(const std::function<std::string(const std::string& id)>& reason) {
  while (!in_flight_.empty()) {
    const uint64_t seq = in_flight_.begin()->first;
    answer(seq, failed(reason(in_flight_.begin()->second.running->request.id)));
  }
}

}  // namespace tessel::engine
