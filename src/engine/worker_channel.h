// The shared-memory objects between the engine and one generation of its worker group, named
// from one prefix: the request queue (engine -> every rank), the result queue (rank 0 -> engine)
// and a control block (handshake flags, the cancel signals, a worker's start-up error).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "tessel/core/io/shm_region.h"
#include "tessel/engine/message_queue.h"

namespace tessel::engine {

// The most requests a worker keeps in flight (EngineConfig::max_batch): each holds one lane, its
// cancel slot in the control block, from the engine's "generate" message to the worker's result.
inline constexpr int kMaxBatchLanes = 64;

struct WorkerControlBlock {
  static constexpr uint64_t kMagic = 0x74657373656c4357ULL;  // "tesselCW"
  uint64_t magic;
  // Per lane, the sequence number of the request to stop between steps (0: none; sequence numbers
  // start at 1). The engine writes it; workers compare it with the sequence of the request in that
  // lane between steps, so a stale value left by the lane's previous request cancels nothing.
  std::atomic<uint64_t> cancel_seq[kMaxBatchLanes];
  std::atomic<uint32_t> ready[MessageQueue::kMaxReaders];  // 1 once rank r loaded its model
  std::atomic<uint32_t> startup_failed;                     // 1 once a rank failed to start
  char startup_error[2048];                                 // that rank's error, NUL-terminated
  // Each rank's heartbeat: the steady clock (CLOCK_MONOTONIC, one clock for every process of the
  // machine) in ms, written every kHeartbeatPeriod by a thread of its own, whatever the rank is
  // doing. A rank whose heartbeat stops (stopped by a signal, swapped out, the process hung as a
  // whole) is found by the engine within the stall timeout, even in the middle of a long step.
  std::atomic<int64_t> heartbeat_ms[MessageQueue::kMaxReaders];
};
inline constexpr std::chrono::milliseconds kHeartbeatPeriod{250};
inline int64_t heartbeat_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the control block needs lock-free atomics across processes");

inline std::string request_queue_name(const std::string& prefix) { return prefix + "-requests"; }
inline std::string result_queue_name(const std::string& prefix) { return prefix + "-results"; }
inline std::string control_block_name(const std::string& prefix) { return prefix + "-control"; }

}  // namespace tessel::engine
