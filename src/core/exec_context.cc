#include "tessel/core/exec_context.h"

#include <cstdint>
#include <string>

#include "tessel/core/allocator.h"
#include "tessel/core/error.h"
#include "tessel/core/parallel.h"

namespace tessel {

Workspace::Workspace(Device device) : device_(device) {}

void Workspace::reserve(size_t bytes) {
  if (bytes <= capacity_) return;
  if (!growable_)
    fail_argument("workspace reserve (a suffix of another workspace cannot grow)",
                  detail::concat("at most ", capacity_, " bytes"), detail::concat(bytes, " bytes"));
  const size_t rounded = workspace_slice_bytes(bytes);
  // Release the old arena first so the peak is the new size, not old + new.
  memory_.reset();
  base_ = nullptr;
  capacity_ = 0;
  // Allocators promise less than the workspace alignment: over-allocate and start aligned.
  memory_ = allocate(rounded + kWorkspaceAlignment, device_.is_cuda() ? MemoryKind::kDevice : MemoryKind::kHost,
                     device_.index);
  const auto address = reinterpret_cast<uintptr_t>(memory_.get());
  base_ = static_cast<std::byte*>(memory_.get()) + (kWorkspaceAlignment - address % kWorkspaceAlignment) % kWorkspaceAlignment;
  capacity_ = rounded;
}

Workspace Workspace::suffix(size_t offset) const {
  const size_t start = workspace_slice_bytes(offset);
  Workspace rest(device_);
  rest.memory_ = memory_;
  rest.growable_ = false;
  if (start < capacity_) {
    rest.base_ = base_ + start;
    rest.capacity_ = capacity_ - start;
  }
  return rest;
}

Workspace Workspace::borrowed(void* data, size_t bytes, Device device) {
  if (data == nullptr && bytes > 0) fail_argument("borrowed workspace data", "a pointer", "null");
  Workspace view(device);
  view.growable_ = false;
  if (data == nullptr) return view;
  // Slices are aligned relative to the base: start at the first aligned byte.
  const auto address = reinterpret_cast<uintptr_t>(data);
  const size_t skip = (kWorkspaceAlignment - address % kWorkspaceAlignment) % kWorkspaceAlignment;
  if (skip >= bytes) return view;
  view.base_ = static_cast<std::byte*>(data) + skip;
  view.capacity_ = bytes - skip;
  return view;
}

void* WorkspaceSlicer::take_bytes(size_t bytes, std::string_view what) {
  const size_t size = workspace_slice_bytes(bytes);
  if (used_ + size > workspace_.capacity())
    throw Error(detail::concat("workspace: ", what, " needs ", size, " bytes after ", used_, " already taken, but only ",
                               workspace_.capacity(), " bytes were reserved (size the workspace at plan time)"));
  void* slice = workspace_.data() + used_;
  used_ += size;
  return slice;
}

int ExecContext::threads() const { return num_threads > 0 ? num_threads : max_threads(); }

void ExecContext::log(LogLevel level, std::string_view message) const {
  if (!log_sink && !log_level) return log_message(level, message);
  if (level < log_level.value_or(tessel::log_level())) return;
  if (log_sink) log_sink(level, message);
  else emit_log(level, message);
}

ExecContext ExecContext::with_workspace(Workspace* other) const {
  ExecContext copy = *this;
  copy.workspace = other;
  return copy;
}

ExecContext ExecContext::on_cpu() const {
  ExecContext copy = *this;
  copy.device = Device::cpu();
  copy.stream = nullptr;
  copy.workspace = nullptr;
  return copy;
}

}  // namespace tessel
