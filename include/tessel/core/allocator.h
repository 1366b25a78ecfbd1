// Raw memory for tensors: aligned host, pinned host (page-locked, for async copies), CUDA device.
#pragma once

#include <cstddef>
#include <memory>

#include "tessel/core/device.h"

namespace tessel {

enum class MemoryKind : uint8_t { kHost, kPinnedHost, kDevice };

inline constexpr size_t kHostAlignment = 64;  // one cache line; also AVX-512 friendly

// Returns owning memory; the deleter frees with the matching API. Zero bytes gives a non-null
// dummy pointer. Throws Error on failure (message states bytes and kind).
std::shared_ptr<void> allocate(size_t bytes, MemoryKind kind, int device_index = 0);

// Pinned memory falls back to aligned host memory when CUDA is absent; this tells which one you got.
bool pinned_memory_is_real();

// Copies bytes between any two of host/device memory (synchronous).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

}  // namespace tessel
