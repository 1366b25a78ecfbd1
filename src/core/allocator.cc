#include "tessel/core/allocator.h"

#include <cstdlib>
#include <cstring>

#include "tessel/core/error.h"
#include "tessel/core/sync_trace.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace tessel {
namespace {

[[maybe_unused]] const char* kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost: return "host";
    case MemoryKind::kPinnedHost: return "pinned host";
    case MemoryKind::kDevice: return "cuda device";
  }
  return "?";
}

std::shared_ptr<void> aligned_host(size_t bytes) {
  const size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  void* p = std::aligned_alloc(kHostAlignment, rounded == 0 ? kHostAlignment : rounded);
  if (p == nullptr) throw Error(detail::concat("allocate: out of host memory for ", bytes, " bytes"));
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

}  // namespace

bool pinned_memory_is_real() { return cuda_available(); }

std::shared_ptr<void> allocate(size_t bytes, MemoryKind kind, int device_index) {
  switch (kind) {
    case MemoryKind::kHost:
      return aligned_host(bytes);
    case MemoryKind::kPinnedHost:
#ifdef TESSEL_WITH_CUDA
      if (cuda_available()) {
        void* p = nullptr;
        if (cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocDefault) != cudaSuccess)
          throw Error(detail::concat("allocate: cudaHostAlloc failed for ", bytes, " bytes of ", kind_name(kind)));
        return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
      }
#endif
      return aligned_host(bytes);
    case MemoryKind::kDevice:
#ifdef TESSEL_WITH_CUDA
      if (cuda_available()) {
        int previous = 0;
        cudaGetDevice(&previous);
        cudaSetDevice(device_index);
        void* p = nullptr;
        const cudaError_t status = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
        cudaSetDevice(previous);
        if (status != cudaSuccess)
          throw Error(detail::concat("allocate: cudaMalloc of ", bytes, " bytes on cuda:", device_index,
                                     " failed: ", cudaGetErrorString(status)));
        return std::shared_ptr<void>(p, [bytes](void* q) {
          // cudaFree waits for the whole device: under NCCL a hang's usual suspect.
          const SyncTraceScope trace(sync_trace_enabled() ? detail::concat("cudaFree ", bytes, " bytes") : std::string());
          cudaFree(q);
        });
      }
#endif
      throw Error(detail::concat("allocate: device memory requested (", bytes,
                                 " bytes) but no CUDA device is available"));
  }
  throw Error("allocate: unknown memory kind");
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef TESSEL_WITH_CUDA
  const SyncTraceScope trace(sync_trace_enabled() ? detail::concat("cudaMemcpy ", bytes, " bytes ", src_device.str(), " -> ", dst_device.str())
                                                  : std::string());
  const cudaError_t status = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  if (status != cudaSuccess)
    throw Error(detail::concat("copy_bytes: cudaMemcpy of ", bytes, " bytes from ", src_device.str(), " to ",
                               dst_device.str(), " failed: ", cudaGetErrorString(status)));
#else
  throw Error(detail::concat("copy_bytes: from ", src_device.str(), " to ", dst_device.str(),
                             " needs CUDA, which this build lacks"));
#endif
}

}  // namespace tessel
