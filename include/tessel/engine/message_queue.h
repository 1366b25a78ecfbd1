// A broadcast message queue between processes of one machine: one writer, a fixed number of
// readers, each reader receiving every message in order. It lives in a POSIX shared-memory object
// (shm_open + mmap): a ring of fixed-size slots guarded by a process-shared robust mutex and two
// process-shared condition variables. A message longer than a slot spans consecutive slots, so
// any size passes; a slot is reused once every reader has consumed it.
//
// The engine sends requests to all workers of a parallel group through one queue (readers = the
// group's ranks) and receives progress and results from rank 0 through another (one reader).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace tessel {
class ShmRegion;
}  // namespace tessel

namespace tessel::engine {

struct MessageQueueShape {
  uint32_t num_readers = 1;    // 1..kMaxReaders
  uint32_t num_slots = 8;      // >= 2
  uint32_t slot_bytes = 65536;  // payload bytes per slot, >= 64
};

class MessageQueue {
 public:
  static constexpr uint32_t kMaxReaders = 64;

  // Creates the shared-memory object `name` ("/tessel-..."; an existing one of that name is
  // replaced) and owns it: the destructor unlinks it. The handle is the writer, or reader
  // `as_reader` when that is >= 0. Throws Error naming a bad shape.
  static MessageQueue create(const std::string& name, const MessageQueueShape& shape, int as_reader = -1);
  // Maps an existing queue as reader `reader` (or as the writer with reader = -1). Throws Error
  // when the object is missing, is not a queue, or the reader index is out of range.
  static MessageQueue open(const std::string& name, int reader);

  MessageQueue() = default;  // an empty handle; assign a created or opened queue
  MessageQueue(MessageQueue&&) noexcept;
  MessageQueue& operator=(MessageQueue&&) noexcept;
  ~MessageQueue();

  // Appends one message for every reader; waits while the ring is full (a slow reader holds the
  // writer back). Returns false when the queue is closed, or when `timeout` passed: then, if part
  // of the message was already out, the queue is closed too (readers never get half a message as
  // a whole one). `give_up`, when set, is asked every 100 ms of waiting and ends the wait like a
  // timeout when it returns true (a worker whose engine died stops waiting for it). One writer only.
  bool send(std::string_view message, std::chrono::milliseconds timeout, const std::function<bool()>& give_up = {});
  // The next message for this reader, or nullopt when none arrived within `timeout` or the queue
  // is closed and drained.
  std::optional<std::string> receive(std::chrono::milliseconds timeout);

  // Wakes every waiter; later sends fail and receives return what is left, then nullopt.
  void close();
  const std::string& name() const;
  // Messages sent but not yet received by `reader` (in slots).
  uint64_t pending_slots(int reader) const;

 private:
  struct Shared;
  static size_t region_bytes(const MessageQueueShape& shape);
  MessageQueue(std::unique_ptr<ShmRegion> region, int reader);

  std::unique_ptr<ShmRegion> region_;
  Shared* shared_ = nullptr;
  int reader_ = -1;
  std::string partial_;  // a reader's message whose last slot has not arrived yet
};

}  // namespace tessel::engine
