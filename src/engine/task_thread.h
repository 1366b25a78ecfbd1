// A thread that runs posted tasks one after another, in order. The engine post-processes
// (encodes) finished requests on one, so that its dispatch thread keeps taking the workers'
// replies while a video is encoded: a worker stepping other requests never waits on a full
// result ring for the engine.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace tessel::engine {

class TaskThread {
 public:
  TaskThread();
  ~TaskThread();  // finish()
  TaskThread(const TaskThread&) = delete;
  TaskThread& operator=(const TaskThread&) = delete;

  void post(std::function<void()> task);
  // Runs every task posted so far, then ends the thread; later posts run on the caller's thread.
  // Idempotent.
  void finish();

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable posted_;
  std::deque<std::function<void()>> tasks_;
  bool finishing_ = false;
  std::thread thread_;
};

}  // namespace tessel::engine
