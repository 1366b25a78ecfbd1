#include "cuda/wan_block_offload.h"

#include "tessel/core/allocator.h"
#include "tessel/core/error.h"
#include "tessel/kernels/cuda/device_guard.h"

namespace tessel::dit::cuda {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(detail::concat("Wan block offload: ", what, ": ", cudaGetErrorString(status)));
}

}  // namespace

WanBlockOffload::WanBlockOffload(Device device, int64_t blocks, size_t block_bytes)
    : device_(device), blocks_(blocks), block_bytes_(block_bytes) {
  if (blocks < 1) fail_argument("offloaded blocks", ">= 1", blocks);
  const tessel::cuda::DeviceGuard guard(device.index);
  host_.reserve(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) host_.push_back(allocate(block_bytes, MemoryKind::kPinnedHost));
  slots_ = allocate(static_cast<size_t>(kSlots) * block_bytes, MemoryKind::kDevice, device.index);
  // Non-blocking: the copies must not wait for (or hold up) work on the legacy default stream.
  check_cuda(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "copy stream");
  for (int64_t s = 0; s < kSlots; ++s) {
    check_cuda(cudaEventCreateWithFlags(&copied_[s], cudaEventDisableTiming), "event");
    check_cuda(cudaEventCreateWithFlags(&consumed_[s], cudaEventDisableTiming), "event");
  }
}

WanBlockOffload::~WanBlockOffload() {
  const tessel::cuda::DeviceGuard guard(device_.index);
  if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);  // no copy may outlive the buffers
  for (int64_t s = 0; s < kSlots; ++s) {
    if (copied_[s] != nullptr) cudaEventDestroy(copied_[s]);
    if (consumed_[s] != nullptr) cudaEventDestroy(consumed_[s]);
  }
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
}

void* WanBlockOffload::host_block(int64_t block) {
  if (block < 0 || block >= blocks_) fail_argument("offloaded block", detail::concat("in [0, ", blocks_, ")"), block);
  return host_[static_cast<size_t>(block)].get();
}

void* WanBlockOffload::slot(int64_t block) const {
  return static_cast<std::byte*>(slots_.get()) + static_cast<size_t>(block % kSlots) * block_bytes_;
}

void WanBlockOffload::copy_into_slot(int64_t block) {
  const int64_t s = block % kSlots;
  if (resident_[s] == block) return;
  // After the last work that read the slot's previous block (a never-recorded event is complete).
  check_cuda(cudaStreamWaitEvent(copy_stream_, consumed_[s], 0), "wait for the slot");
  check_cuda(cudaMemcpyAsync(slot(block), host_block(block), block_bytes_, cudaMemcpyHostToDevice, copy_stream_), "block copy");
  check_cuda(cudaEventRecord(copied_[s], copy_stream_), "record the copy");
  resident_[s] = block;
  ++copies_;
}

void WanBlockOffload::prefetch(int64_t block) {
  const tessel::cuda::DeviceGuard guard(device_.index);
  copy_into_slot(block);
}

void WanBlockOffload::acquire(int64_t block, cudaStream_t stream) {
  const tessel::cuda::DeviceGuard guard(device_.index);
  copy_into_slot(block);
  check_cuda(cudaStreamWaitEvent(stream, copied_[block % kSlots], 0), "wait for the block");
}

void WanBlockOffload::release(int64_t block, cudaStream_t stream, int64_t next) {
  const tessel::cuda::DeviceGuard guard(device_.index);
  check_cuda(cudaEventRecord(consumed_[block % kSlots], stream), "record the block's use");
  if (next >= 0 && next < blocks_) copy_into_slot(next);
}

}  // namespace tessel::dit::cuda
