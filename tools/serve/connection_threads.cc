// See connection_threads.h.
#include "connection_threads.h"

#include <thread>

namespace tessel::serve {
namespace {

thread_local bool admitted_past_cap = false;

}  // namespace

ConnectionThreads::ConnectionThreads(size_t max_connections, size_t overflow)
    : max_connections_(max_connections), overflow_(overflow) {}

ConnectionThreads::~ConnectionThreads() { shutdown(); }

void ConnectionThreads::enqueue(std::function<void()> fn) {
  bool past_cap = false;
  {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [this] { return active_ < max_connections_ + overflow_; });
    past_cap = active_ >= max_connections_;
    ++active_;
  }
  // Detached: shutdown() waits on the count, which each thread lowers as its last act.
  std::thread([this, fn = std::move(fn), past_cap]() mutable {
    admitted_past_cap = past_cap;
    fn();  // httplib's connection handler: never throws (it catches what its handlers throw)
    fn = nullptr;  // nothing of the connection outlives the count
    std::lock_guard lock(mutex_);
    --active_;
    changed_.notify_all();
  }).detach();
}

void ConnectionThreads::shutdown() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return active_ == 0; });
}

bool ConnectionThreads::overloaded() { return admitted_past_cap; }

size_t ConnectionThreads::active() const {
  std::lock_guard lock(mutex_);
  return active_;
}

}  // namespace tessel::serve
