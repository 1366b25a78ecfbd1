#include "task_thread.h"

namespace tessel::engine {

TaskThread::TaskThread() : thread_([this] { loop(); }) {}

TaskThread::~TaskThread() { finish(); }

void TaskThread::post(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    if (!finishing_) {
      tasks_.push_back(std::move(task));
      posted_.notify_one();
      return;
    }
  }
  task();
}

void TaskThread::finish() {
  {
    std::lock_guard lock(mutex_);
    finishing_ = true;
    posted_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void TaskThread::loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      posted_.wait(lock, [&] { return finishing_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // finishing, and every task ran
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace tessel::engine
