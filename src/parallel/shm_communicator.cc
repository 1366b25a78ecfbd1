// The shared-memory communicator of communicator.h: CPU tensors between processes of one host.
//
// Layout of the world's shared memory: a header (magic, size, slot size, each rank's pid, a table
// of barriers, one per group, allocated by split()) and then one staging slot per world rank. Every
// collective runs in pieces of at most a slot: each member writes its piece into its own slot,
// the group meets at its barrier, each member reads what it needs from the others' slots, and the
// group meets again before anyone overwrites a slot. A rank only ever writes its own slot and a
// rank is in one collective at a time, so groups that share ranks (Ulysses and Ring groups of one
// world) never disturb each other.
//
// The barrier is a sense-reversing counter whose generation word is a futex (the process-shared
// form, not FUTEX_PRIVATE: the waiters are other processes). While waiting, a rank checks every
// half second that the members it waits for still live, so that a crashed peer gives an error
// rather than a hang.
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <numeric>
#include <optional>
#include <vector>

#include "communicator_checks.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x6d736c6573736574ULL;  // "tesselsm"
constexpr int kMaxRanks = 256;
constexpr int kMaxGroups = 1024;  // barrier 0 is the world's; split() takes free ones, a group's death frees its own
constexpr size_t kMinSlotBytes = 4096;

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "the barrier's generation word must be a plain 32-bit futex word");

struct alignas(64) GroupBarrier {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;
  // Members whose communicator on this barrier is alive; 0: the entry is free for the next split.
  std::atomic<uint32_t> holders;
};

struct WorldHeader {
  uint64_t magic;
  int32_t size;
  uint64_t slot_bytes;
  std::atomic<int32_t> pids[kMaxRanks];
  GroupBarrier barriers[kMaxGroups];
};

constexpr size_t slots_offset() { return (sizeof(WorldHeader) + 4095) / 4096 * 4096; }

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}


// The world's mapping, shared by the communicators split from it.
struct ShmMapping {
  ShmRegion region;
  WorldHeader* header = nullptr;
  uint8_t* slot(int world_rank) const {
    return static_cast<uint8_t*>(region.data()) + slots_offset() + static_cast<size_t>(world_rank) * header->slot_bytes;
  }
};

class ShmCommunicator final : public Communicator {
 public:
  ShmCommunicator(std::shared_ptr<const ShmMapping> mapping, std::vector<int> members, int index, int barrier)
      : mapping_(std::move(mapping)), members_(std::move(members)), index_(index), barrier_(barrier) {}
  // The last member of a split group to let go frees its barrier for later splits.
  ~ShmCommunicator() override {
    if (barrier_ != 0) mapping_->header->barriers[barrier_].holders.fetch_sub(1, std::memory_order_acq_rel);
  }
  ShmCommunicator(const ShmCommunicator&) = delete;
  ShmCommunicator& operator=(const ShmCommunicator&) = delete;

  int rank() const override { return index_; }
  int size() const override { return static_cast<int>(members_.size()); }
  Device device() const override { return Device::cpu(); }
  std::string engine() const override { return "shm"; }

  void all_to_all(const ExecContext&, const TensorView& send, const TensorView& recv) override {
    const size_t chunk = parallel_detail::check_all_to_all(*this, send, recv);
    const size_t n = members_.size();
    const size_t part = slot_bytes() / n / 64 * 64;  // each destination's share of a slot
    const auto* in = static_cast<const uint8_t*>(send.data());
    auto* out = static_cast<uint8_t*>(recv.data());
    for_each_piece(chunk, part, [&](size_t offset, size_t bytes) {
      for (size_t j = 0; j < n; ++j) std::memcpy(own_slot() + j * part, in + j * chunk + offset, bytes);
      wait_for_group();
      for (size_t i = 0; i < n; ++i)
        std::memcpy(out + i * chunk + offset, member_slot(i) + static_cast<size_t>(index_) * part, bytes);
      wait_for_group();
    });
  }

  void all_gather(const ExecContext&, const TensorView& send, const TensorView& recv) override {
    parallel_detail::check_all_gather(*this, send, recv);
    const size_t total = send.nbytes();
    const auto* in = static_cast<const uint8_t*>(send.data());
    auto* out = static_cast<uint8_t*>(recv.data());
    for_each_piece(total, slot_bytes(), [&](size_t offset, size_t bytes) {
      std::memcpy(own_slot(), in + offset, bytes);
      wait_for_group();
      for (size_t i = 0; i < members_.size(); ++i) std::memcpy(out + i * total + offset, member_slot(i), bytes);
      wait_for_group();
    });
  }

  void all_reduce_sum(const ExecContext&, const TensorView& tensor) override {
    parallel_detail::check_comm_tensor(*this, tensor, "tensor");
    if (tensor.dtype() == DType::kF32) sum_in_rank_order<float>(tensor);
    else if (tensor.dtype() == DType::kF64) sum_in_rank_order<double>(tensor);
    else fail_argument("tensor", "dtype fp32 or fp64 (shared-memory sum)", dtype_name(tensor.dtype()));
  }

  // Done when it returns: the exchange is staged through the slots like the collectives.
  std::unique_ptr<PendingExchange> ring_exchange_async(const ExecContext&, const TensorView& send,
                                                       const TensorView& recv) override {
    parallel_detail::check_ring_exchange(*this, send, recv);
    const size_t n = members_.size();
    const size_t previous = (static_cast<size_t>(index_) + n - 1) % n;
    const auto* in = static_cast<const uint8_t*>(send.data());
    auto* out = static_cast<uint8_t*>(recv.data());
    if (n == 1) {
      if (in != out) std::memcpy(out, in, send.nbytes());
    } else {
      for_each_piece(send.nbytes(), slot_bytes(), [&](size_t offset, size_t bytes) {
        std::memcpy(own_slot(), in + offset, bytes);
        wait_for_group();
        std::memcpy(out + offset, member_slot(previous), bytes);
        wait_for_group();
      });
    }
    return parallel_detail::make_done_exchange();
  }

  // Each rank stages [to_previous | to_next] in its slot (half a slot each, in pieces) and reads its
  // neighbours' halves meant for it.
  void neighbour_exchange(const ExecContext&, const TensorView& to_previous, const TensorView& to_next, const TensorView& from_previous,
                          const TensorView& from_next) override {
    const size_t total = parallel_detail::check_neighbour_exchange(*this, to_previous, to_next, from_previous, from_next);
    if (members_.size() == 1) return;
    const size_t half = slot_bytes() / 2 / 64 * 64;
    const bool has_previous = index_ > 0, has_next = static_cast<size_t>(index_) + 1 < members_.size();
    for_each_piece(total, half, [&](size_t offset, size_t bytes) {
      std::memcpy(own_slot(), static_cast<const uint8_t*>(to_previous.data()) + offset, bytes);
      std::memcpy(own_slot() + half, static_cast<const uint8_t*>(to_next.data()) + offset, bytes);
      wait_for_group();
      if (has_previous) std::memcpy(static_cast<uint8_t*>(from_previous.data()) + offset, member_slot(static_cast<size_t>(index_) - 1) + half, bytes);
      if (has_next) std::memcpy(static_cast<uint8_t*>(from_next.data()) + offset, member_slot(static_cast<size_t>(index_) + 1), bytes);
      wait_for_group();
    });
  }

  void barrier(const ExecContext&) override { wait_for_group(); }

  // Two all-gathers over this group: every rank's (color, key), then the barrier each new group's
  // first member took from the world's table (a free entry, claimed for the group's members).
  std::unique_ptr<Communicator> split(int color, int key, const SplitOptions&) const override {
    if (color < 0) fail_argument("color", ">= 0", color);
    auto& self = const_cast<ShmCommunicator&>(*this);  // collectives change no observable state
    const ExecContext cpu;
    const size_t n = members_.size();
    std::vector<int32_t> mine = {color, key}, all(2 * n);
    self.all_gather(cpu, TensorView(mine.data(), DType::kI32, Device::cpu(), {2}),
                    TensorView(all.data(), DType::kI32, Device::cpu(), {static_cast<int64_t>(2 * n)}));
    std::vector<size_t> group;  // indices in this communicator, ordered by (key, index)
    for (size_t i = 0; i < n; ++i)
      if (all[2 * i] == color) group.push_back(i);
    std::stable_sort(group.begin(), group.end(), [&](size_t a, size_t b) { return all[2 * a + 1] < all[2 * b + 1]; });
    const bool leader = group.front() == static_cast<size_t>(index_);
    int32_t taken = leader ? claim_barrier(static_cast<uint32_t>(group.size())) : -1;
    std::vector<int32_t> barriers(n);
    self.all_gather(cpu, TensorView(&taken, DType::kI32, Device::cpu(), {1}),
                    TensorView(barriers.data(), DType::kI32, Device::cpu(), {static_cast<int64_t>(n)}));
    const int32_t barrier = barriers[group.front()];
    if (barrier < 0)
      throw Error(detail::concat("shared-memory communicator: more than ", kMaxGroups - 1, " groups of one world alive at once"));
    std::vector<int> world_ranks;
    int position = 0;
    for (size_t i = 0; i < group.size(); ++i) {
      if (group[i] == static_cast<size_t>(index_)) position = static_cast<int>(i);
      world_ranks.push_back(members_[group[i]]);
    }
    return std::make_unique<ShmCommunicator>(mapping_, std::move(world_ranks), position, barrier);
  }

  // Meets the group at its barrier; with a deadline, throws Error once it passes.
  void wait_for_group(std::optional<Clock::time_point> deadline = std::nullopt) const {
    GroupBarrier& b = mapping_->header->barriers[barrier_];
    const uint32_t generation = b.generation.load(std::memory_order_acquire);
    if (b.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == members_.size()) {
      b.arrived.store(0, std::memory_order_relaxed);
      b.generation.fetch_add(1, std::memory_order_release);
      futex(&b.generation, FUTEX_WAKE, INT32_MAX, nullptr);
      return;
    }
    // A short yield loop first: in a busy collective the others are usually microseconds away.
    for (int spin = 0; spin < 64 && b.generation.load(std::memory_order_acquire) == generation; ++spin) sched_yield();
    auto next_check = Clock::now() + std::chrono::milliseconds(500);
    while (b.generation.load(std::memory_order_acquire) == generation) {
      const timespec slice{0, 100'000'000};
      futex(&b.generation, FUTEX_WAIT, generation, &slice);
      if (Clock::now() < next_check) continue;
      next_check = Clock::now() + std::chrono::milliseconds(500);
      check_members_alive();
      if (deadline && Clock::now() > *deadline)
        throw Error(detail::concat("shared-memory communicator ", quoted_excerpt(mapping_->region.name()), ": not every rank ",
                                   "arrived in time (rank ", members_[static_cast<size_t>(index_)], " waited)"));
    }
  }

 private:
  size_t slot_bytes() const { return mapping_->header->slot_bytes; }
  uint8_t* own_slot() const { return mapping_->slot(members_[static_cast<size_t>(index_)]); }
  const uint8_t* member_slot(size_t i) const { return mapping_->slot(members_[i]); }

  // A free barrier entry (not the world's), now held by `holders` members; -1 when none is free.
  int32_t claim_barrier(uint32_t holders) const {
    for (int i = 1; i < kMaxGroups; ++i) {
      uint32_t free = 0;
      if (mapping_->header->barriers[i].holders.compare_exchange_strong(free, holders, std::memory_order_acq_rel)) return i;
    }
    return -1;
  }

  template <class Piece>
  static void for_each_piece(size_t total, size_t capacity, const Piece& piece) {
    for (size_t offset = 0; offset < total; offset += capacity) piece(offset, std::min(capacity, total - offset));
  }

  // The same order on every rank (rank 0's value, plus rank 1's, ...): every rank gets the same bits.
  template <class T>
  void sum_in_rank_order(const TensorView& tensor) {
    auto* data = static_cast<T*>(tensor.data());
    const size_t capacity = slot_bytes() / sizeof(T);
    for_each_piece(static_cast<size_t>(tensor.numel()), capacity, [&](size_t offset, size_t count) {
      std::memcpy(own_slot(), data + offset, count * sizeof(T));
      wait_for_group();
      for (size_t e = 0; e < count; ++e) {
        T sum = reinterpret_cast<const T*>(member_slot(0))[e];
        for (size_t i = 1; i < members_.size(); ++i) sum += reinterpret_cast<const T*>(member_slot(i))[e];
        data[offset + e] = sum;
      }
      wait_for_group();
    });
  }

  void check_members_alive() const {
    for (const int member : members_) {
      const int32_t pid = mapping_->header->pids[member].load();
      if (pid > 0 && pid != getpid() && !process_alive(pid))
        throw Error(detail::concat("shared-memory communicator ", quoted_excerpt(mapping_->region.name()), ": rank ", member,
                                   " (pid ", pid, ") exited while rank ", members_[static_cast<size_t>(index_)],
                                   " waited for it in a collective"));
    }
  }

  std::shared_ptr<const ShmMapping> mapping_;
  std::vector<int> members_;  // world ranks, in this group's rank order
  int index_;                 // this process's rank in the group
  int barrier_;               // the group's entry in the barrier table
};

}  // namespace

ShmWorld ShmWorld::create(const std::string& name, int size, size_t slot_bytes) {
  if (size < 1 || size > kMaxRanks) fail_argument("ShmWorld size", detail::concat("1..", kMaxRanks, " ranks"), size);
  slot_bytes = std::max(kMinSlotBytes, (slot_bytes + 63) / 64 * 64);
  ShmWorld world;
  world.region_ = ShmRegion::create(name, slots_offset() + static_cast<size_t>(size) * slot_bytes);
  auto* header = static_cast<WorldHeader*>(world.region_.data());
  header->size = size;
  header->slot_bytes = slot_bytes;
  header->magic = kMagic;
  world.size_ = size;
  return world;
}

std::unique_ptr<Communicator> make_shm_communicator(const std::string& name, int rank, double join_timeout_s) {
  auto mapping = std::make_shared<ShmMapping>();
  mapping->region = ShmRegion::open(name, slots_offset(), "shared-memory world");
  mapping->header = static_cast<WorldHeader*>(mapping->region.data());
  WorldHeader& header = *mapping->header;
  if (header.magic != kMagic) fail_argument("shared-memory world", "a region made by ShmWorld::create", quoted_excerpt(name));
  if (rank < 0 || rank >= header.size) fail_argument("rank", detail::concat("0..", header.size - 1), rank);
  if (mapping->region.size() < slots_offset() + static_cast<size_t>(header.size) * header.slot_bytes)
    fail_argument("shared-memory world", "its full size", detail::concat(mapping->region.size(), " bytes"));
  int32_t unset = 0;
  const int32_t self = static_cast<int32_t>(getpid());
  if (!header.pids[rank].compare_exchange_strong(unset, self) && unset != self && process_alive(unset))
    fail_argument("rank", detail::concat("a rank no live process has joined (pid ", unset, " holds ", rank, ")"), rank);
  header.pids[rank].store(self);
  std::vector<int> members(static_cast<size_t>(header.size));
  std::iota(members.begin(), members.end(), 0);
  auto world = std::make_unique<ShmCommunicator>(std::move(mapping), std::move(members), rank, 0);
  world->wait_for_group(Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(join_timeout_s * 1000.0)));
  return world;
}

}  // namespace tessel
