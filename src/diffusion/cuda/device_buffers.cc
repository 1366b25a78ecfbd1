#include "cuda/device_buffers.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "tessel/core/error.h"

namespace tessel::vae::cuda {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = other.pool_, data_ = other.data_, bytes_ = other.bytes_;
    other.pool_ = nullptr, other.data_ = nullptr, other.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::release() {
  if (pool_ != nullptr && data_ != nullptr) pool_->give_back(data_, bytes_);
  pool_ = nullptr, data_ = nullptr, bytes_ = 0;
}

DeviceBufferPool::~DeviceBufferPool() { free_kept(); }

DeviceBuffer DeviceBufferPool::take(int64_t count) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(float);
  std::vector<float*>& kept = kept_[bytes];
  if (!kept.empty()) {
    float* data = kept.back();
    kept.pop_back();
    return DeviceBuffer(this, data, bytes);
  }
  void* data = nullptr;
  cudaError_t status = cudaMalloc(&data, bytes);
  if (status != cudaSuccess) {
    // Buffers kept for other sizes may be what is missing: free them and try once more.
    cudaGetLastError();
    free_kept();
    status = cudaMalloc(&data, bytes);
  }
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw Error(detail::concat("Wan VAE CUDA decode: cudaMalloc of ", bytes, " bytes failed (", cudaGetErrorString(status), "; ",
                               held_bytes_, " bytes already held by the decoder)"));
  }
  held_bytes_ += bytes;
  return DeviceBuffer(this, static_cast<float*>(data), bytes);
}

void DeviceBufferPool::free_kept() {
  for (auto& entry : kept_)
    for (float* data : entry.second) {
      cudaFree(data);
      held_bytes_ -= entry.first;
    }
  kept_.clear();
}

}  // namespace tessel::vae::cuda
