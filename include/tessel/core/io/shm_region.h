// A POSIX shared-memory object mapped into this process (shm_open + mmap), unmapped on
// destruction and unlinked by its creator.
#pragma once

#include <cstddef>
#include <string>

namespace tessel {

class ShmRegion {
 public:
  ShmRegion() = default;
  // Creates `name` ('/' then up to 199 characters without '/'; an existing object of that name is
  // replaced) with `bytes` zeroed bytes; the region unlinks it when destroyed.
  static ShmRegion create(const std::string& name, size_t bytes);
  // Maps an existing object, at least `min_bytes` long. Throws Error naming `what` otherwise.
  static ShmRegion open(const std::string& name, size_t min_bytes, const char* what);

  ShmRegion(ShmRegion&& other) noexcept;
  ShmRegion& operator=(ShmRegion&& other) noexcept;
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;
  ~ShmRegion();

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool owner_ = false;
};

// False once `pid` has exited (gone, or a zombie its parent has not reaped yet).
bool process_alive(int pid);

// A process killed by a signal leaves its shared-memory objects behind (their owners never ran
// their destructors). Objects named "/<stem><pid>-..." whose pid has exited are removed; others'
// (live processes', other names) are left. Linux (/dev/shm); returns how many were removed.
size_t remove_stale_shm_regions(const std::string& stem);

}  // namespace tessel
