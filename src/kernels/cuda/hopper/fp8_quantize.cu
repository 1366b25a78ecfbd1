// Quantization of q, k, v to the FP8 operands of the Hopper kernel's FP8 mode (fp8_operands.h):
// small kernels in stream order, each reading its input once more from L2/L1 for the second pass
// (the block maxima first, then the scaled values). K smoothing adds no pass over the tensors: k's
// channel sums come from the pass that takes v's channel maxima, and the q pass takes each row's
// LSE shift from the q values it already holds.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "cuda/hopper/fp8_operands.h"
#include "tessel/core/error.h"

namespace tessel::cuda::detail {

namespace {

constexpr int kHeadDim = 128;  // the only head dim of the FP8 mode
constexpr int kBlockThreads = 128;

template <typename T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x);
  else
    return __half2float(x);
}

__device__ __forceinline__ uint16_t fp8x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

// The reciprocal of fp8_dequantization: absmax maps to 448; an all-zero block gets 1.
__device__ __forceinline__ float quantization_factor(float absmax) { return absmax > 0.f ? kFp8Max / absmax : 1.f; }

// The K smoothing of quantize_token_blocks_kernel (all null without it): k's `channel_mean`
// ((B, H, 128), subtracted from k before its blocks are scaled), or for q the means of its kv
// heads (head / group) and where each row's `scale` x q . mean goes ((B, H_q, S_q)).
struct Smoothing {
  const float* channel_mean = nullptr;
  const float* dot_mean = nullptr;
  int group = 1;
  float scale = 0.f;
  float* row_dot = nullptr;
};

// One CTA per (64-token block, head, batch) of a (B, S, H, 128) tensor: the block's absolute
// maximum, then the values times 448 / max as e4m3 into the contiguous (B, S, H, 128) output, and
// max / 448 into scale[(b * H + h) * blocks + block]. Threads move 8 elements (16 bytes) at a time;
// the 16 chunks of a row are 16 consecutive threads of one warp.
template <typename T>
__global__ void __launch_bounds__(kBlockThreads) quantize_token_blocks_kernel(const T* src, int64_t stride_b,
                                                                               int64_t stride_s, int64_t stride_h,
                                                                               int seq, int heads, uint8_t* dst,
                                                                               float* scale, Smoothing smoothing) {
  constexpr int kChunksPerRow = kHeadDim / 8;
  constexpr int kChunks = kFp8ScaleBlock * kChunksPerRow;
  const int block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int s0 = block * kFp8ScaleBlock;
  const int rows = min(kFp8ScaleBlock, seq - s0);
  const T* base = src + batch * stride_b + head * stride_h;
  const float* mean_row =
      smoothing.channel_mean ? smoothing.channel_mean + (static_cast<int64_t>(batch) * heads + head) * kHeadDim : nullptr;
  // Chunk c's 8 values, less the channel means with K smoothing.
  auto chunk_at = [&](int c, float (&x)[8]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(base + static_cast<int64_t>(s0 + c / kChunksPerRow) * stride_s +
                                                      (c % kChunksPerRow) * 8);
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = to_float(v[e]) - (mean_row ? __ldg(mean_row + (c % kChunksPerRow) * 8 + e) : 0.f);
  };
  float absmax = 0.f;
  for (int c = threadIdx.x; c < rows * kChunksPerRow; c += kBlockThreads) {
    float x[8];
    chunk_at(c, x);
#pragma unroll
    for (int e = 0; e < 8; ++e) absmax = fmaxf(absmax, fabsf(x[e]));
  }
  __shared__ float warp_max[kBlockThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, offset));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = absmax;
  __syncthreads();
  absmax = fmaxf(fmaxf(warp_max[0], warp_max[1]), fmaxf(warp_max[2], warp_max[3]));
  const float factor = quantization_factor(absmax);
  if (threadIdx.x == 0) {
    const int blocks = gridDim.x;
    scale[(static_cast<int64_t>(batch) * heads + head) * blocks + block] = fp8_dequantization(absmax);
  }
  static_assert(kChunks % kBlockThreads == 0);
  const float* dot_mean =
      smoothing.dot_mean
          ? smoothing.dot_mean + (static_cast<int64_t>(batch) * (heads / smoothing.group) + head / smoothing.group) * kHeadDim
          : nullptr;
  // Every thread runs every round (rows past the block's end idle), so the row dot's shuffles see
  // all 32 lanes.
  for (int c = threadIdx.x; c < kChunks; c += kBlockThreads) {
    const bool in_block = c < rows * kChunksPerRow;
    float x[8] = {};
    if (in_block) chunk_at(c, x);
    const int64_t token = (static_cast<int64_t>(batch) * seq + s0 + c / kChunksPerRow) * heads + head;
    if (in_block) {
      uint2 packed;
      packed.x = fp8x2(x[0] * factor, x[1] * factor) | (static_cast<uint32_t>(fp8x2(x[2] * factor, x[3] * factor)) << 16);
      packed.y = fp8x2(x[4] * factor, x[5] * factor) | (static_cast<uint32_t>(fp8x2(x[6] * factor, x[7] * factor)) << 16);
      *reinterpret_cast<uint2*>(dst + token * kHeadDim + (c % kChunksPerRow) * 8) = packed;
    }
    if (dot_mean != nullptr) {  // uniform over the grid
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) dot = fmaf(x[e], __ldg(dot_mean + (c % kChunksPerRow) * 8 + e), dot);
#pragma unroll
      for (int offset = kChunksPerRow / 2; offset > 0; offset >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      if (in_block && c % kChunksPerRow == 0)
        smoothing.row_dot[(static_cast<int64_t>(batch) * heads + head) * seq + s0 + c / kChunksPerRow] = dot * smoothing.scale;
    }
  }
}

// Per-channel absolute maxima of v: one CTA of 128 threads (one per channel) per (256-token
// slice, kv head, batch), merged with atomicMax on the float bits (non-negative floats order as
// their bits do) into absmax, zeroed before. With K smoothing (k_sums not null) the same CTA sums
// its slice of k per channel into k_sums[((b * H + h) * slices + slice) * 128 + d].
constexpr int kChannelSlice = 256;
template <typename T>
__global__ void __launch_bounds__(kHeadDim) channel_statistics_kernel(const T* v, int64_t v_stride_b, int64_t v_stride_s,
                                                                      int64_t v_stride_h, const T* k, int64_t k_stride_b,
                                                                      int64_t k_stride_s, int64_t k_stride_h, int seq,
                                                                      int heads, uint32_t* absmax, float* k_sums) {
  const int head = blockIdx.y, batch = blockIdx.z, d = threadIdx.x;
  const int s0 = blockIdx.x * kChannelSlice, s1 = min(seq, s0 + kChannelSlice);
  const T* base = v + batch * v_stride_b + head * v_stride_h + d;
  float m = 0.f;
  for (int s = s0; s < s1; ++s) m = fmaxf(m, fabsf(to_float(base[static_cast<int64_t>(s) * v_stride_s])));
  const int64_t channel = (static_cast<int64_t>(batch) * heads + head) * kHeadDim + d;
  atomicMax(absmax + channel, __float_as_uint(m));
  if (k_sums != nullptr) {
    const T* k_base = k + batch * k_stride_b + head * k_stride_h + d;
    float sum = 0.f;
    for (int s = s0; s < s1; ++s) sum += to_float(k_base[static_cast<int64_t>(s) * k_stride_s]);
    k_sums[((static_cast<int64_t>(batch) * heads + head) * gridDim.x + blockIdx.x) * kHeadDim + d] = sum;
  }
}

// K's channel means: one CTA per (kv head, batch), a thread per channel summing the slices' sums in
// order.
__global__ void __launch_bounds__(kHeadDim) channel_mean_kernel(const float* k_sums, int slices, int seq, int heads,
                                                                float* mean) {
  const int64_t row = static_cast<int64_t>(blockIdx.y) * heads + blockIdx.x;
  float sum = 0.f;
  for (int slice = 0; slice < slices; ++slice) sum += k_sums[(row * slices + slice) * kHeadDim + threadIdx.x];
  mean[row * kHeadDim + threadIdx.x] = sum / static_cast<float>(seq);
}

// v transposed to (B, H_kv, 128, seq_padded) e4m3 with each channel times 448 / its maximum, 64
// keys per CTA: staged as floats in shared memory (rows padded by one word: the transposed reads
// hit distinct banks), then each thread writes 4 consecutive key slots of one channel, slot j of a
// 32-key group holding key fp8_key_order(j). Keys past seq are zeros. The tile is read in 16-byte
// chunks, all of a thread's chunks loaded before any is stored: with one 2-byte load per thread
// and iteration the kernel moved about 1 TB/s (0.2 ms of an FP8 call at S = 12,870, H = 40).
template <typename T>
__global__ void __launch_bounds__(256) transpose_values_kernel(const T* v, int64_t stride_b, int64_t stride_s,
                                                               int64_t stride_h, int seq, int heads,
                                                               const uint32_t* absmax, uint8_t* vt, int seq_padded) {
  constexpr int kKeys = 64;
  __shared__ float tile[kKeys][kHeadDim + 1];
  __shared__ float factor[kHeadDim];
  const int head = blockIdx.y, batch = blockIdx.z;
  const int s0 = blockIdx.x * kKeys;
  const int64_t channel0 = (static_cast<int64_t>(batch) * heads + head) * kHeadDim;
  for (int d = threadIdx.x; d < kHeadDim; d += blockDim.x) factor[d] = quantization_factor(__uint_as_float(absmax[channel0 + d]));
  __syncthreads();
  const T* base = v + batch * stride_b + head * stride_h;
  constexpr int kChunksPerRow = kHeadDim / 8;
  constexpr int kChunksPerThread = kKeys * kChunksPerRow / 256;
  static_assert(kKeys * kChunksPerRow % 256 == 0, "the launch has 256 threads");
  uint4 chunk[kChunksPerThread];
#pragma unroll
  for (int r = 0; r < kChunksPerThread; ++r) {
    const int c = threadIdx.x + r * 256, s = c / kChunksPerRow;
    chunk[r] = s0 + s < seq ? *reinterpret_cast<const uint4*>(base + static_cast<int64_t>(s0 + s) * stride_s +
                                                              (c % kChunksPerRow) * 8)
                            : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int r = 0; r < kChunksPerThread; ++r) {
    const int c = threadIdx.x + r * 256, s = c / kChunksPerRow, d0 = (c % kChunksPerRow) * 8;
    const T* x = reinterpret_cast<const T*>(&chunk[r]);
#pragma unroll
    for (int e = 0; e < 8; ++e) tile[s][d0 + e] = to_float(x[e]) * factor[d0 + e];  // zeros stay zeros
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kHeadDim * (kKeys / 4); i += blockDim.x) {
    const int d = i / (kKeys / 4), j = (i % (kKeys / 4)) * 4;
    const int group = j & ~31;
    auto at = [&](int slot) { return tile[group + fp8_key_order((j + slot) & 31)][d]; };
    const uint32_t packed = fp8x2(at(0), at(1)) | (static_cast<uint32_t>(fp8x2(at(2), at(3))) << 16);
    *reinterpret_cast<uint32_t*>(vt + (channel0 + d) * seq_padded + s0 + j) = packed;
  }
}

int64_t blocks_of(int64_t tokens, int64_t block) { return (tokens + block - 1) / block; }

// The slices in the order take_fp8_operands cuts them; `fn(bytes, name)` per slice.
template <typename Fn>
void for_each_slice(const Fp8Shape& s, Fn&& fn) {
  const int64_t padded = blocks_of(s.seq_kv, kFp8ScaleBlock) * kFp8ScaleBlock;
  fn(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim), "fp8 q");
  fn(static_cast<size_t>(s.batch * s.seq_kv * s.heads_kv * s.head_dim), "fp8 k");
  fn(static_cast<size_t>(s.batch * s.heads_kv * s.head_dim * padded), "fp8 transposed v");
  fn(static_cast<size_t>(s.batch * s.heads_q * blocks_of(s.seq_q, kFp8ScaleBlock)) * 4, "fp8 q scales");
  fn(static_cast<size_t>(s.batch * s.heads_kv * blocks_of(s.seq_kv, kFp8ScaleBlock)) * 4, "fp8 k scales");
  fn(static_cast<size_t>(s.batch * s.heads_kv * s.head_dim) * 4, "fp8 v channel maxima");
  fn(static_cast<size_t>(s.batch * s.heads_kv * blocks_of(s.seq_kv, kChannelSlice) * s.head_dim) * 4,
     "fp8 k channel sums");
  fn(static_cast<size_t>(s.batch * s.heads_kv * s.head_dim) * 4, "fp8 k channel means");
  fn(static_cast<size_t>(s.batch * s.heads_q * s.seq_q) * 4, "fp8 lse shifts");
}

template <typename T>
void launch_typed(const FlashParams& p, const Fp8Shape& s, const Fp8Operands& o, bool smooth_k, bool quantize_query_key,
                  cudaStream_t stream) {
  const int batch = static_cast<int>(s.batch), heads_q = static_cast<int>(s.heads_q);
  const int heads_kv = static_cast<int>(s.heads_kv);
  cudaMemsetAsync(o.v_absmax, 0, static_cast<size_t>(s.batch * s.heads_kv * kHeadDim) * sizeof(uint32_t), stream);
  const int slices = static_cast<int>(blocks_of(s.seq_kv, kChannelSlice));
  const dim3 slice_grid(static_cast<unsigned>(slices), heads_kv, batch);
  const T* k = static_cast<const T*>(p.k);
  channel_statistics_kernel<T><<<slice_grid, kHeadDim, 0, stream>>>(
      static_cast<const T*>(p.v), p.v_stride_b, p.v_stride_s, p.v_stride_h, k, p.k_stride_b, p.k_stride_s, p.k_stride_h,
      p.seq_kv, heads_kv, o.v_absmax, smooth_k ? o.k_slice_sums : nullptr);
  Smoothing q_smoothing, k_smoothing;
  if (smooth_k) {
    channel_mean_kernel<<<dim3(heads_kv, batch), kHeadDim, 0, stream>>>(o.k_slice_sums, slices, p.seq_kv, heads_kv,
                                                                        o.k_mean);
    k_smoothing.channel_mean = o.k_mean;
    if (p.lse != nullptr) {  // the kernel reads the shifts only where it writes an LSE
      q_smoothing.dot_mean = o.k_mean;
      q_smoothing.group = p.group;
      q_smoothing.scale = p.scale_log2 * 0.69314718055994531f;  // the softmax scale
      q_smoothing.row_dot = o.lse_shift;
    }
  }
  if (quantize_query_key) {
    const dim3 q_grid(static_cast<unsigned>(blocks_of(s.seq_q, kFp8ScaleBlock)), heads_q, batch);
    const dim3 kv_grid(static_cast<unsigned>(blocks_of(s.seq_kv, kFp8ScaleBlock)), heads_kv, batch);
    quantize_token_blocks_kernel<T><<<q_grid, kBlockThreads, 0, stream>>>(static_cast<const T*>(p.q), p.q_stride_b,
                                                                          p.q_stride_s, p.q_stride_h, p.seq_q, heads_q,
                                                                          o.q, o.q_scale, q_smoothing);
    quantize_token_blocks_kernel<T><<<kv_grid, kBlockThreads, 0, stream>>>(k, p.k_stride_b, p.k_stride_s, p.k_stride_h,
                                                                           p.seq_kv, heads_kv, o.k, o.k_scale, k_smoothing);
  }
  const dim3 transpose_grid(static_cast<unsigned>(o.seq_kv_padded / kFp8ScaleBlock), heads_kv, batch);
  transpose_values_kernel<T><<<transpose_grid, 256, 0, stream>>>(static_cast<const T*>(p.v), p.v_stride_b,
                                                                 p.v_stride_s, p.v_stride_h, p.seq_kv, heads_kv,
                                                                 o.v_absmax, o.vt, o.seq_kv_padded);
}

}  // namespace

size_t fp8_operand_bytes(const Fp8Shape& shape) {
  size_t bytes = 0;
  for_each_slice(shape, [&](size_t slice, const char*) { bytes += slice + kWorkspaceAlignment; });
  return bytes;
}

Fp8Operands take_fp8_operands(const Workspace& workspace, const Fp8Shape& shape) {
  WorkspaceSlicer slicer(workspace);
  void* slices[9] = {};
  int n = 0;
  for_each_slice(shape, [&](size_t bytes, const char* name) { slices[n++] = slicer.take_bytes(bytes, name); });
  Fp8Operands o;
  o.q = static_cast<uint8_t*>(slices[0]);
  o.k = static_cast<uint8_t*>(slices[1]);
  o.vt = static_cast<uint8_t*>(slices[2]);
  o.q_scale = static_cast<float*>(slices[3]);
  o.k_scale = static_cast<float*>(slices[4]);
  o.v_absmax = static_cast<uint32_t*>(slices[5]);
  o.k_slice_sums = static_cast<float*>(slices[6]);
  o.k_mean = static_cast<float*>(slices[7]);
  o.lse_shift = static_cast<float*>(slices[8]);
  o.seq_kv_padded = static_cast<int>(blocks_of(shape.seq_kv, kFp8ScaleBlock) * kFp8ScaleBlock);
  return o;
}

void launch_fp8_quantize(const FlashParams& params, DType dtype, const Fp8Shape& shape, const Fp8Operands& operands,
                         bool smooth_k, bool quantize_query_key, cudaStream_t stream) {
  if (shape.head_dim != kHeadDim)
    throw Error(tessel::detail::concat("FP8 quantization: head dim ", shape.head_dim, ", expected ", kHeadDim));
  if (smooth_k && !quantize_query_key)
    throw Error("FP8 quantization: K smoothing needs k quantized here (its channel means come before its block scales)");
  if (dtype == DType::kBF16)
    launch_typed<__nv_bfloat16>(params, shape, operands, smooth_k, quantize_query_key, stream);
  else
    launch_typed<__half>(params, shape, operands, smooth_k, quantize_query_key, stream);
}

}  // namespace tessel::cuda::detail
