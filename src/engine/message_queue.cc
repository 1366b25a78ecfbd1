// The shared-memory broadcast ring of message_queue.h. Sequence numbers count slots and never wrap
// in practice (64 bits); slot s lives at index s % num_slots. The writer may reuse a slot once the
// slowest reader's sequence has passed it.
#include "tessel/engine/message_queue.h"

#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <utility>

#include "tessel/core/io/shm_region.h"
#include "tessel/core/error.h"

namespace tessel::engine {
namespace {

constexpr uint64_t kMagic = 0x74657373656c4d51ULL;  // "tesselMQ"
constexpr uint32_t kVersion = 1;
constexpr std::chrono::milliseconds kGiveUpPoll{100};  // how often a waiting writer asks give_up

struct SlotHeader {
  uint32_t bytes;  // payload bytes in this slot
  uint32_t last;   // 1 when this slot ends its message
};

timespec deadline_after(std::chrono::milliseconds timeout) {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const int64_t ns = now.tv_nsec + static_cast<int64_t>(timeout.count() % 1000) * 1000000;
  timespec at{};
  at.tv_sec = now.tv_sec + static_cast<time_t>(timeout.count() / 1000) + static_cast<time_t>(ns / 1000000000);
  at.tv_nsec = static_cast<long>(ns % 1000000000);
  return at;
}

}  // namespace

struct MessageQueue::Shared {
  uint64_t magic;
  uint32_t version;
  uint32_t num_readers;
  uint32_t num_slots;
  uint32_t slot_bytes;
  pthread_mutex_t mutex;
  pthread_cond_t readable;
  pthread_cond_t writable;
  uint32_t closed;
  uint64_t write_seq;
  uint64_t read_seq[kMaxReaders];

  size_t slot_stride() const { return sizeof(SlotHeader) + (slot_bytes + 7) / 8 * 8; }
  std::byte* slot(uint64_t seq) {
    return reinterpret_cast<std::byte*>(this + 1) + (seq % num_slots) * slot_stride();
  }
  uint64_t slowest_reader() const { return *std::min_element(read_seq, read_seq + num_readers); }
};

namespace {

// Locks the queue's robust mutex; a holder that died leaves it to us in a consistent state (every
// update under the lock is a few stores that either happened or did not).
class QueueLock {
 public:
  explicit QueueLock(pthread_mutex_t* mutex) : mutex_(mutex) {
    if (pthread_mutex_lock(mutex_) == EOWNERDEAD) pthread_mutex_consistent(mutex_);
  }
  ~QueueLock() { pthread_mutex_unlock(mutex_); }
  QueueLock(const QueueLock&) = delete;
  QueueLock& operator=(const QueueLock&) = delete;
  // Waits on `cond` until `deadline`; false on timeout.
  bool wait(pthread_cond_t* cond, const timespec& deadline) {
    const int rc = pthread_cond_timedwait(cond, mutex_, &deadline);
    if (rc == EOWNERDEAD) pthread_mutex_consistent(mutex_);
    return rc != ETIMEDOUT;
  }

 private:
  pthread_mutex_t* mutex_;
};

}  // namespace

size_t MessageQueue::region_bytes(const MessageQueueShape& shape) {
  return sizeof(Shared) + static_cast<size_t>(shape.num_slots) * (sizeof(SlotHeader) + (shape.slot_bytes + 7) / 8 * 8);
}

MessageQueue::MessageQueue(std::unique_ptr<ShmRegion> region, int reader)
    : region_(std::move(region)), shared_(static_cast<Shared*>(region_->data())), reader_(reader) {}

MessageQueue::MessageQueue(MessageQueue&&) noexcept = default;
MessageQueue& MessageQueue::operator=(MessageQueue&&) noexcept = default;
MessageQueue::~MessageQueue() = default;

const std::string& MessageQueue::name() const {
  TESSEL_CHECK(region_ != nullptr, "MessageQueue::name: the queue was moved from");
  return region_->name();
}

MessageQueue MessageQueue::create(const std::string& name, const MessageQueueShape& shape, int as_reader) {
  if (shape.num_readers < 1 || shape.num_readers > kMaxReaders)
    fail_argument("MessageQueueShape.num_readers", detail::concat("1..", kMaxReaders), shape.num_readers);
  if (shape.num_slots < 2) fail_argument("MessageQueueShape.num_slots", ">= 2", shape.num_slots);
  if (shape.slot_bytes < 64 || shape.slot_bytes > (1u << 30))
    fail_argument("MessageQueueShape.slot_bytes", "64..2^30", shape.slot_bytes);
  if (as_reader < -1 || as_reader >= static_cast<int>(shape.num_readers))
    fail_argument("MessageQueue::create as_reader", detail::concat("-1 (writer) or 0..", shape.num_readers - 1), as_reader);
  auto region = std::make_unique<ShmRegion>(ShmRegion::create(name, region_bytes(shape)));
  auto* shared = static_cast<Shared*>(region->data());
  shared->num_readers = shape.num_readers;
  shared->num_slots = shape.num_slots;
  shared->slot_bytes = shape.slot_bytes;
  pthread_mutexattr_t mutex_attr;
  pthread_mutexattr_init(&mutex_attr);
  pthread_mutexattr_setpshared(&mutex_attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&mutex_attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&shared->mutex, &mutex_attr);
  pthread_mutexattr_destroy(&mutex_attr);
  pthread_condattr_t cond_attr;
  pthread_condattr_init(&cond_attr);
  pthread_condattr_setpshared(&cond_attr, PTHREAD_PROCESS_SHARED);
  pthread_condattr_setclock(&cond_attr, CLOCK_MONOTONIC);
  pthread_cond_init(&shared->readable, &cond_attr);
  pthread_cond_init(&shared->writable, &cond_attr);
  pthread_condattr_destroy(&cond_attr);
  shared->version = kVersion;
  __atomic_store_n(&shared->magic, kMagic, __ATOMIC_RELEASE);  // last: open() checks it
  return MessageQueue(std::move(region), as_reader);
}

MessageQueue MessageQueue::open(const std::string& name, int reader) {
  auto region = std::make_unique<ShmRegion>(ShmRegion::open(name, sizeof(Shared), "message queue"));
  const auto* shared = static_cast<const Shared*>(region->data());
  if (__atomic_load_n(&shared->magic, __ATOMIC_ACQUIRE) != kMagic || shared->version != kVersion ||
      region->size() < region_bytes({shared->num_readers, shared->num_slots, shared->slot_bytes}))
    throw Error(detail::concat("MessageQueue: ", quoted_excerpt(name), " is not a message queue of version ", kVersion));
  if (reader < -1 || reader >= static_cast<int>(shared->num_readers))
    fail_argument("MessageQueue::open reader", detail::concat("-1 (writer) or 0..", shared->num_readers - 1), reader);
  return MessageQueue(std::move(region), reader);
}

bool MessageQueue::send(std::string_view message, std::chrono::milliseconds timeout, const std::function<bool()>& give_up) {
  TESSEL_CHECK(shared_ != nullptr, "MessageQueue::send: the queue was moved from");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  QueueLock lock(&shared_->mutex);
  size_t offset = 0;
  do {
    while (!shared_->closed && shared_->write_seq - shared_->slowest_reader() >= shared_->num_slots) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || (give_up && give_up())) {
        if (offset > 0) {  // readers hold the start of a message that will never end
          shared_->closed = 1;
          pthread_cond_broadcast(&shared_->readable);
        }
        return false;
      }
      lock.wait(&shared_->writable, deadline_after(std::min(left, kGiveUpPoll)));
    }
    if (shared_->closed) return false;
    const size_t chunk = std::min<size_t>(shared_->slot_bytes, message.size() - offset);
    std::byte* slot = shared_->slot(shared_->write_seq);
    const SlotHeader header{static_cast<uint32_t>(chunk), offset + chunk == message.size() ? 1u : 0u};
    std::memcpy(slot, &header, sizeof header);
    std::memcpy(slot + sizeof header, message.data() + offset, chunk);
    offset += chunk;
    ++shared_->write_seq;
    pthread_cond_broadcast(&shared_->readable);
  } while (offset < message.size());
  return true;
}

std::optional<std::string> MessageQueue::receive(std::chrono::milliseconds timeout) {
  TESSEL_CHECK(shared_ != nullptr, "MessageQueue::receive: the queue was moved from");
  TESSEL_CHECK(reader_ >= 0, "MessageQueue::receive: opened as the writer, not as a reader");
  const timespec deadline = deadline_after(timeout);
  QueueLock lock(&shared_->mutex);
  uint64_t& seq = shared_->read_seq[reader_];
  for (;;) {
    while (seq == shared_->write_seq) {
      if (shared_->closed || !lock.wait(&shared_->readable, deadline)) return std::nullopt;
    }
    SlotHeader header{};
    const std::byte* slot = shared_->slot(seq);
    std::memcpy(&header, slot, sizeof header);
    if (header.bytes > shared_->slot_bytes) throw Error(detail::concat("MessageQueue ", name(), ": corrupt slot ", seq));
    partial_.append(reinterpret_cast<const char*>(slot + sizeof header), header.bytes);
    ++seq;
    pthread_cond_broadcast(&shared_->writable);
    if (header.last) return std::exchange(partial_, std::string());
  }
}

void MessageQueue::close() {
  if (shared_ == nullptr) return;
  QueueLock lock(&shared_->mutex);
  shared_->closed = 1;
  pthread_cond_broadcast(&shared_->readable);
  pthread_cond_broadcast(&shared_->writable);
}

uint64_t MessageQueue::pending_slots(int reader) const {
  TESSEL_CHECK(shared_ != nullptr, "MessageQueue::pending_slots: the queue was moved from");
  if (reader < 0 || reader >= static_cast<int>(shared_->num_readers))
    fail_argument("MessageQueue::pending_slots reader", detail::concat("0..", shared_->num_readers - 1), reader);
  QueueLock lock(&shared_->mutex);
  return shared_->write_seq - shared_->read_seq[reader];
}

}  // namespace tessel::engine
