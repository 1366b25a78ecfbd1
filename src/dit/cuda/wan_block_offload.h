// Block offload for the Wan CUDA forward (internal): every block's weights in pinned host memory,
// two device slots that blocks take in turn (block i uses slot i % 2), and a copy stream of its own
// that fills a slot with the next block but one while the current block computes. Events order it:
// a slot is refilled only after the work that used its previous block is done (on whatever stream
// that ran), and the compute stream waits for a block's copy before its first kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "tessel/core/device.h"

namespace tessel::dit::cuda {

class WanBlockOffload {
 public:
  static constexpr int64_t kSlots = 2;

  // Pinned host copies of `blocks` blocks of `block_bytes` each and kSlots device slots on `device`.
  WanBlockOffload(Device device, int64_t blocks, size_t block_bytes);
  ~WanBlockOffload();
  WanBlockOffload(const WanBlockOffload&) = delete;
  WanBlockOffload& operator=(const WanBlockOffload&) = delete;

  void* host_block(int64_t block);            // where a block's tensors are written at load
  void* slot(int64_t block) const;            // the device slot `block` maps to
  // Starts copying `block` into its slot (after the slot's previous block's work), unless it is there.
  void prefetch(int64_t block);
  // Makes `block` resident for the work enqueued next on `stream`: copies it into its slot unless
  // the slot holds it already, and makes `stream` wait for that copy.
  void acquire(int64_t block, cudaStream_t stream);
  // The work that reads `block` has been enqueued on `stream`; its slot may be refilled once that
  // work is done. `next` (>= 0): the block to copy into the freed slot now, ahead of its use.
  void release(int64_t block, cudaStream_t stream, int64_t next);

  // One forward at a time enqueues copies (the slots' contents are this object's state).
  std::mutex& mutex() { return mutex_; }
  size_t block_bytes() const { return block_bytes_; }
  size_t device_bytes() const { return static_cast<size_t>(kSlots) * block_bytes_; }
  size_t host_bytes() const { return static_cast<size_t>(blocks_) * block_bytes_; }
  int64_t copies() const { return copies_; }  // blocks copied so far (tests: a resident block is not copied again)

 private:
  void copy_into_slot(int64_t block);

  Device device_;
  int64_t blocks_;
  size_t block_bytes_;
  std::vector<std::shared_ptr<void>> host_;
  std::shared_ptr<void> slots_;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t copied_[kSlots] = {}, consumed_[kSlots] = {};
  int64_t resident_[kSlots] = {-1, -1};  // the block each slot holds or is being filled with
  int64_t copies_ = 0;
  std::mutex mutex_;
};

}  // namespace tessel::dit::cuda
