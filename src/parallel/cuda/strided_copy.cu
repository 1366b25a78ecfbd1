// One grid-stride kernel per copy: each thread moves one vector of up to 16 bytes of a row, its
// source and destination offsets computed from the row's multi-index (see strided_copy.h).
#include "strided_copy.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "tessel/core/error.h"

namespace tessel::parallel_detail::cuda {
namespace {

// The layout in bytes after dropping size-1 dimensions and merging dimensions that are contiguous
// with the next one in both views: fewer divisions per thread, and often one long row.
struct ByteLayout {
  int rank = 0;  // outer dimensions (rows are indexed by them)
  int64_t sizes[kMaxStridedRank] = {};
  int64_t src[kMaxStridedRank] = {}, dst[kMaxStridedRank] = {};
  int64_t row_bytes = 0, rows = 1;
};

ByteLayout byte_layout(const StridedLayout& layout, int element_bytes, bool with_src) {
  int64_t sizes[kMaxStridedRank], src[kMaxStridedRank], dst[kMaxStridedRank];
  int n = 0;
  for (int d = 0; d < layout.rank; ++d) {
    if (layout.sizes[d] == 1 && d != layout.rank - 1) continue;
    sizes[n] = layout.sizes[d];
    src[n] = with_src ? layout.src_strides[d] * element_bytes : 0;
    dst[n] = layout.dst_strides[d] * element_bytes;
    ++n;
  }
  // The innermost dimension is contiguous: it is the row, in bytes.
  ByteLayout out;
  int64_t row = sizes[n - 1] * element_bytes;
  --n;
  // Merge outer dimensions whose stride equals the row's extent into the row.
  while (n > 0 && dst[n - 1] == row && (!with_src || src[n - 1] == row)) {
    row *= sizes[n - 1];
    --n;
  }
  // Merge adjacent outer dimensions that are contiguous with each other in both views.
  int m = 0;
  for (int d = 0; d < n; ++d) {
    if (m > 0 && out.dst[m - 1] == dst[d] * sizes[d] && (!with_src || out.src[m - 1] == src[d] * sizes[d])) {
      out.sizes[m - 1] *= sizes[d];
      out.dst[m - 1] = dst[d];
      out.src[m - 1] = src[d];
      continue;
    }
    out.sizes[m] = sizes[d];
    out.src[m] = src[d];
    out.dst[m] = dst[d];
    ++m;
  }
  out.rank = m;
  out.row_bytes = row;
  for (int d = 0; d < m; ++d) out.rows *= out.sizes[d];
  return out;
}

// The widest vector (16, 8, 4, 2 or 1 bytes) that divides the row, every stride and both pointers.
int vector_bytes(const ByteLayout& l, const void* src, const void* dst) {
  uint64_t bits = static_cast<uint64_t>(l.row_bytes) | reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src);
  for (int d = 0; d < l.rank; ++d) bits |= static_cast<uint64_t>(l.src[d]) | static_cast<uint64_t>(l.dst[d]);
  for (int width : {16, 8, 4, 2})
    if (bits % static_cast<uint64_t>(width) == 0) return width;
  return 1;
}

template <int kBytes>
struct alignas(kBytes) Vector {
  unsigned char bytes[kBytes];
};

template <typename V, bool kCopy>
__global__ void strided_kernel(const char* __restrict__ src, char* __restrict__ dst, ByteLayout l, int64_t vectors_per_row) {
  const int64_t total = l.rows * vectors_per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t row = i / vectors_per_row;
    const int64_t column = (i - row * vectors_per_row) * static_cast<int64_t>(sizeof(V));
    int64_t src_offset = column, dst_offset = column;
    for (int d = l.rank - 1; d >= 0; --d) {
      const int64_t index = row % l.sizes[d];
      row /= l.sizes[d];
      src_offset += index * l.src[d];
      dst_offset += index * l.dst[d];
    }
    V value;
    if constexpr (kCopy) {
      value = *reinterpret_cast<const V*>(src + src_offset);
    } else {
#pragma unroll
      for (int b = 0; b < static_cast<int>(sizeof(V)); ++b) value.bytes[b] = 0;
    }
    *reinterpret_cast<V*>(dst + dst_offset) = value;
  }
}

template <bool kCopy>
void launch(void* stream, const void* src, void* dst, const StridedLayout& layout, int element_bytes) {
  if (layout.rank < 1 || layout.rank > kMaxStridedRank)
    fail_argument("layout.rank", detail::concat("in [1, ", kMaxStridedRank, "]"), layout.rank);
  for (int d = 0; d < layout.rank; ++d)
    if (layout.sizes[d] == 0) return;
  const ByteLayout l = byte_layout(layout, element_bytes, kCopy);
  const int width = vector_bytes(l, src, dst);
  const int64_t vectors_per_row = l.row_bytes / width, total = l.rows * vectors_per_row;
  constexpr int kThreads = 256;
  // Enough blocks to fill the GPU several times over; the grid-stride loop takes the rest.
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, 132 * 16);
  auto* s = static_cast<const char*>(src);
  auto* t = static_cast<char*>(dst);
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(blocks));
  switch (width) {
    case 16: strided_kernel<Vector<16>, kCopy><<<grid, kThreads, 0, cuda_stream>>>(s, t, l, vectors_per_row); break;
    case 8: strided_kernel<Vector<8>, kCopy><<<grid, kThreads, 0, cuda_stream>>>(s, t, l, vectors_per_row); break;
    case 4: strided_kernel<Vector<4>, kCopy><<<grid, kThreads, 0, cuda_stream>>>(s, t, l, vectors_per_row); break;
    case 2: strided_kernel<Vector<2>, kCopy><<<grid, kThreads, 0, cuda_stream>>>(s, t, l, vectors_per_row); break;
    default: strided_kernel<Vector<1>, kCopy><<<grid, kThreads, 0, cuda_stream>>>(s, t, l, vectors_per_row); break;
  }
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw Error(detail::concat(kCopy ? "copy_strided" : "zero_strided", ": kernel launch failed: ", cudaGetErrorString(status)));
}

}  // namespace

void copy_strided(void* stream, const void* src, void* dst, const StridedLayout& layout, int element_bytes) {
  launch<true>(stream, src, dst, layout, element_bytes);
}

void zero_strided(void* stream, void* dst, const StridedLayout& layout, int element_bytes) {
  launch<false>(stream, nullptr, dst, layout, element_bytes);
}

}  // namespace tessel::parallel_detail::cuda
