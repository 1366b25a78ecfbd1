// head_error_sums on the device: one CTA per (token chunk, head) sums its elements in fp64 (each
// thread a fixed stride, then a fixed-shape tree), so reruns give identical sums.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/head_error_sums.h"

namespace tessel::cuda::detail {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kRowsPerChunk = 128;
constexpr int kMaxChunks = 512;

__device__ __forceinline__ double load_as_double(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::kF16: return __half2float(static_cast<const __half*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ double warp_sum(double x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__global__ void head_error_sums_kernel(const HeadErrorSumsParams p) {
  const int chunk = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int64_t rows_per_chunk = (p.rows + p.chunks - 1) / p.chunks;
  const int64_t r0 = chunk * rows_per_chunk, r1 = r0 + rows_per_chunk < p.rows ? r0 + rows_per_chunk : p.rows;
  const int64_t elements = r1 > r0 ? (r1 - r0) * p.head_dim : 0;
  double sums[4] = {0.0, 0.0, 0.0, 0.0};
  for (int64_t e = tid; e < elements; e += blockDim.x) {
    const int64_t row = r0 + e / p.head_dim, d = e % p.head_dim;
    const int64_t i = (row * p.heads + h) * p.head_dim + d;
    const double a = load_as_double(p.approx, p.approx_dtype, i), r = load_as_double(p.reference, p.reference_dtype, i);
    sums[0] += (a - r) * (a - r);
    sums[1] += r * r;
    sums[2] += a * a;
    sums[3] += a * r;
  }
  __shared__ double s_sums[4][kThreads / 32];
  const int lane = tid & 31, warp = tid >> 5;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const double w = warp_sum(sums[k]);
    if (lane == 0) s_sums[k][warp] = w;
  }
  __syncthreads();
  if (tid < 4) {
    double total = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) total += s_sums[tid][w];
    p.partial[(static_cast<int64_t>(h) * p.chunks + chunk) * 4 + tid] = total;
  }
}

}  // namespace

int head_error_sums_chunks(int64_t rows) {
  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  return static_cast<int>(chunks < 1 ? 1 : (chunks > kMaxChunks ? kMaxChunks : chunks));
}

void launch_head_error_sums(const HeadErrorSumsParams& p, cudaStream_t stream) {
  head_error_sums_kernel<<<dim3(p.chunks, static_cast<unsigned>(p.heads)), kThreads, 0, stream>>>(p);
}

}  // namespace tessel::cuda::detail
