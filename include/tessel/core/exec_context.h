// The execution context: where and how a call that launches work runs. Every public entry point
// that launches work takes a `const ExecContext&` as its first argument; nothing is read from
// thread-local or global state instead.
//
//   device       the device the stream and the workspace belong to. Entry points dispatch on their
//                tensors' device; a default context (CPU, null stream) is accepted for work on any
//                device and then means "the tensors' device, legacy default stream".
//   stream       the CUDA stream CUDA work is enqueued on (nullptr = legacy default stream). Plain
//                pointer type, so this header compiles without CUDA; it is cudaStream_t.
//   workspace    scratch memory the caller owns. Plan-time code sizes it with reserve(); run-time
//                code takes slices of it (WorkspaceSlicer) and never allocates, so a CUDA stream
//                can be captured into a graph and CPU calls do not page-fault fresh buffers. A run
//                that needs more than was reserved throws Error. Null: entry points that need
//                scratch allocate it for the call (convenient, slower, not capturable).
//   num_threads  CPU threads for CPU kernels (0 = the OpenMP default).
//   log_sink / log_level  where messages of work run under this context go (empty / unset = the
//                process-wide sink and level of log.h).
//
// A context is a small value: copy it freely. It does not own the workspace. Two threads that run
// work concurrently need two workspaces (a workspace is not synchronized), but may share plans.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string_view>

#include "tessel/core/device.h"
#include "tessel/core/log.h"

struct CUstream_st;

namespace tessel {

using StreamHandle = CUstream_st*;

// Every slice of a workspace starts on this alignment (covers AVX-512 and CUDA vector loads).
inline constexpr size_t kWorkspaceAlignment = 256;

// Bytes a slice of `bytes` occupies in a workspace. Plan-time sizing code sums these for the
// slices the run will take, in any order.
constexpr size_t workspace_slice_bytes(size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// A byte arena on one device (host memory for the CPU, device memory for CUDA).
class Workspace {
 public:
  explicit Workspace(Device device = Device::cpu());

  Device device() const { return device_; }
  size_t capacity() const { return capacity_; }
  std::byte* data() const { return base_; }

  // Grows the arena to at least `bytes` (never shrinks; contents are not kept). Allocates: call it
  // at plan time, outside CUDA-graph capture. A no-op when the capacity suffices. A workspace made
  // by suffix() cannot grow and throws Error instead.
  void reserve(size_t bytes);

  // The bytes from `offset` on, as a workspace that shares this one's memory (for a callee that
  // takes its own slices after the caller's). offset is rounded up to the alignment.
  Workspace suffix(size_t offset) const;
  // A workspace over memory someone else owns and keeps alive (e.g. passed through a C API),
  // from its first aligned byte on; it cannot grow.
  static Workspace borrowed(void* data, size_t bytes, Device device);

 private:
  Device device_;
  std::shared_ptr<void> memory_;
  std::byte* base_ = nullptr;
  size_t capacity_ = 0;
  bool growable_ = true;
};

// Hands out consecutive aligned slices of one workspace for one run. Never allocates; throws
// Error naming the slice, the bytes asked for and the bytes reserved when the workspace is short.
class WorkspaceSlicer {
 public:
  explicit WorkspaceSlicer(const Workspace& workspace) : workspace_(workspace) {}

  void* take_bytes(size_t bytes, std::string_view what);
  template <typename T>
  T* take(size_t count, std::string_view what) {
    return static_cast<T*>(take_bytes(count * sizeof(T), what));
  }
  size_t used() const { return used_; }
  // The unused rest, for a callee that takes its own slices.
  Workspace rest() const { return workspace_.suffix(used_); }

 private:
  const Workspace& workspace_;
  size_t used_ = 0;
};

struct ExecContext {
  Device device{};
  StreamHandle stream = nullptr;
  Workspace* workspace = nullptr;
  int num_threads = 0;
  LogSink log_sink;
  std::optional<LogLevel> log_level;

  // The CPU thread count to use: num_threads, or the OpenMP default when it is 0 or negative.
  int threads() const;
  // Sends a message to log_sink (or the process-wide sink) unless it is below the level.
  void log(LogLevel level, std::string_view message) const;
  // This context with another workspace (same device, stream, threads and logging).
  ExecContext with_workspace(Workspace* other) const;
  // This context for work on the host whatever its device: the CPU, no stream, no workspace (the
  // caller's would be the device's), the same threads and logging.
  ExecContext on_cpu() const;
};

}  // namespace tessel
