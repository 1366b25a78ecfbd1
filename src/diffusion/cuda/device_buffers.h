// Device memory for the VAE decoder's activations (internal). Decoding makes the same buffers chunk
// after chunk (every latent frame after the first has the same shapes), so a buffer given back is
// kept, by size, for the next request of that size instead of being freed: after the first two
// chunks a decode allocates nothing, and no cudaFree (which synchronizes the device) runs between
// kernels. All work is enqueued on one stream, so a buffer given back may be handed out again at
// once: the stream runs the old user's kernels before the new one's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace tessel::vae::cuda {

class DeviceBufferPool;

// fp32 device memory from a pool; returned to the pool when destroyed. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  float* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  friend class DeviceBufferPool;
  DeviceBuffer(DeviceBufferPool* pool, float* data, size_t bytes) : pool_(pool), data_(data), bytes_(bytes) {}
  void release();
  DeviceBufferPool* pool_ = nullptr;
  float* data_ = nullptr;
  size_t bytes_ = 0;
};

class DeviceBufferPool {
 public:
  DeviceBufferPool() = default;
  DeviceBufferPool(const DeviceBufferPool&) = delete;
  DeviceBufferPool& operator=(const DeviceBufferPool&) = delete;
  ~DeviceBufferPool();  // frees the kept buffers; every DeviceBuffer must be gone by then

  // `count` floats on the current device (uninitialized). Throws Error naming the bytes when the
  // device is out of memory.
  DeviceBuffer take(int64_t count);
  // Frees the kept buffers (after a decode of other shapes, whose sizes will not come again).
  void free_kept();
  // Bytes held: handed out and kept.
  size_t bytes_held() const { return held_bytes_; }

 private:
  friend class DeviceBuffer;
  void give_back(float* data, size_t bytes) { kept_[bytes].push_back(data); }
  std::map<size_t, std::vector<float*>> kept_;
  size_t held_bytes_ = 0;
};

}  // namespace tessel::vae::cuda
