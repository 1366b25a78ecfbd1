// The bounded FIFO of request_scheduler.h. Every request has one Entry from submit until forget
// (or until it is the oldest of more than keep_finished final entries); its status only moves
// forward (queued -> running -> final, or queued -> cancelled), and finalize_locked is the one
// place a final answer is given, so no request is answered twice.
#include "tessel/engine/request_scheduler.h"

#include <algorithm>

namespace tessel::engine {

std::string_view output_kind_name(OutputKind kind) { return kind == OutputKind::kImage ? "image" : "video"; }

std::string_view request_status_name(RequestStatus status) {
  switch (status) {
    case RequestStatus::kQueued: return "queued";
    case RequestStatus::kRunning: return "running";
    case RequestStatus::kSucceeded: return "succeeded";
    case RequestStatus::kFailed: return "failed";
    case RequestStatus::kCancelled: return "cancelled";
  }
  return "unknown";
}

RequestScheduler::RequestScheduler(size_t max_queue, size_t keep_finished)
    : max_queue_(max_queue), keep_finished_(keep_finished) {
  if (max_queue < 1) fail_argument("RequestScheduler max_queue", ">= 1", max_queue);
}

std::string RequestScheduler::submit(GenerationRequest request, const std::string& id_prefix) {
  std::lock_guard lock(mutex_);
  if (!accepting_) throw NotAcceptingError("the server is shutting down and accepts no new requests");
  if (queue_.size() >= max_queue_) {
    ++counts_.rejected_queue_full;
    throw QueueFullError(detail::concat("the queue is full (", max_queue_, " requests waiting); retry later"));
  }
  Entry entry;
  entry.sequence = next_id_;
  request.id = detail::concat(id_prefix, "-", next_id_++);
  entry.state.request = std::move(request);
  entry.state.status = RequestStatus::kQueued;
  entry.state.created_at = std::chrono::system_clock::now();
  entry.queued_at = std::chrono::steady_clock::now();
  const std::string id = entry.state.request.id;
  entries_.emplace(id, std::move(entry));
  queue_.push_back(id);
  changed_.notify_all();
  return id;
}

std::shared_ptr<RunningRequest> RequestScheduler::next(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [&] { return !queue_.empty() || closed_; });
  if (queue_.empty()) return nullptr;
  Entry& entry = entries_.at(queue_.front());
  queue_.pop_front();
  entry.state.status = RequestStatus::kRunning;
  entry.running = std::make_shared<RunningRequest>();
  entry.running->request = entry.state.request;
  entry.running->started_at = std::chrono::steady_clock::now();
  entry.running->queued_seconds = std::chrono::duration<double>(entry.running->started_at - entry.queued_at).count();
  changed_.notify_all();
  return entry.running;
}

void RequestScheduler::report_progress(const std::string& id, const RequestProgress& progress) {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(id);
  if (it != entries_.end() && it->second.state.status == RequestStatus::kRunning) it->second.state.progress = progress;
}

void RequestScheduler::finalize_locked(Entry& entry, GenerationOutput output) {
  entry.state.status = output.status;
  switch (output.status) {
    case RequestStatus::kSucceeded: ++counts_.succeeded; break;
    case RequestStatus::kCancelled: ++counts_.cancelled; break;
    default: entry.state.status = RequestStatus::kFailed; ++counts_.failed; break;
  }
  entry.state.output = std::make_shared<const GenerationOutput>(std::move(output));
  entry.running.reset();
  finished_.push_back(entry.state.request.id);
  while (finished_.size() > keep_finished_) {
    entries_.erase(finished_.front());
    finished_.pop_front();
  }
  changed_.notify_all();
}

bool RequestScheduler::finish(const std::string& id, GenerationOutput output) {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(id);
  if (it == entries_.end() || it->second.state.status != RequestStatus::kRunning) return false;
  finalize_locked(it->second, std::move(output));
  return true;
}

CancelOutcome RequestScheduler::cancel(const std::string& id) {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(id);
  if (it == entries_.end()) return CancelOutcome::kNotFound;
  Entry& entry = it->second;
  switch (entry.state.status) {
    case RequestStatus::kQueued: {
      queue_.erase(std::find(queue_.begin(), queue_.end(), id));
      GenerationOutput output;
      output.status = RequestStatus::kCancelled;
      output.error = "cancelled while queued";
      finalize_locked(entry, std::move(output));
      return CancelOutcome::kCancelledWhileQueued;
    }
    case RequestStatus::kRunning:
      entry.running->cancel_requested = true;
      return CancelOutcome::kCancelRequested;
    default:
      return CancelOutcome::kAlreadyFinished;
  }
}

RequestSnapshot RequestScheduler::snapshot_locked(const Entry& entry) const {
  RequestSnapshot snapshot = entry.state;
  if (snapshot.status == RequestStatus::kQueued)
    snapshot.queue_position = std::find(queue_.begin(), queue_.end(), snapshot.request.id) - queue_.begin();
  return snapshot;
}

std::optional<RequestSnapshot> RequestScheduler::snapshot(const std::string& id) const {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return snapshot_locked(it->second);
}

std::vector<RequestSnapshot> RequestScheduler::list(OutputKind kind) const {
  std::vector<std::pair<uint64_t, RequestSnapshot>> found;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [id, entry] : entries_)
      if (entry.state.request.kind == kind) found.emplace_back(entry.sequence, snapshot_locked(entry));
  }
  // The map orders ids as text ("video-10" before "video-2"): the submission order is the sequence.
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<RequestSnapshot> snapshots;
  snapshots.reserve(found.size());
  for (auto& [sequence, snapshot] : found) snapshots.push_back(std::move(snapshot));
  return snapshots;
}

std::optional<RequestSnapshot> RequestScheduler::wait(const std::string& id, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [&] {
    const auto it = entries_.find(id);
    return it == entries_.end() || is_final(it->second.state.status);
  });
  const auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return snapshot_locked(it->second);
}

void RequestScheduler::forget(const std::string& id) {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(id);
  if (it == entries_.end() || !is_final(it->second.state.status)) return;
  entries_.erase(it);
  finished_.erase(std::find(finished_.begin(), finished_.end(), id));
}

void RequestScheduler::stop_accepting() {
  std::lock_guard lock(mutex_);
  accepting_ = false;
}

void RequestScheduler::cancel_queued(const std::string& reason) {
  std::lock_guard lock(mutex_);
  while (!queue_.empty()) {
    Entry& entry = entries_.at(queue_.front());
    queue_.pop_front();
    GenerationOutput output;
    output.status = RequestStatus::kCancelled;
    output.error = reason;
    finalize_locked(entry, std::move(output));
  }
}

void RequestScheduler::cancel_running() {
  std::lock_guard lock(mutex_);
  for (auto& [id, entry] : entries_)
    if (entry.running) entry.running->cancel_requested = true;
}

void RequestScheduler::close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
  changed_.notify_all();
}

bool RequestScheduler::accepting() const {
  std::lock_guard lock(mutex_);
  return accepting_;
}

SchedulerCounts RequestScheduler::counts() const {
  std::lock_guard lock(mutex_);
  SchedulerCounts counts = counts_;
  counts.queued = static_cast<int64_t>(queue_.size());
  counts.running = 0;
  for (const auto& [id, entry] : entries_) counts.running += entry.state.status == RequestStatus::kRunning;
  return counts;
}

}  // namespace tessel::engine
