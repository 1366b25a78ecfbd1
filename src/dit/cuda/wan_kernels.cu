// The Wan forward's element-wise and row-wise kernels (see wan_kernels.h). Row kernels run one
// block per row and reduce in fp32 through warp shuffles; element kernels use grid-stride loops.
#include "cuda/wan_kernels.h"

#include <cuda_fp8.h>

#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/kernels/cuda/fp8_rows.h"

namespace tessel::dit::cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int kElementThreads = 256;
// Grid-stride kernels launch at most this many blocks; each thread then walks the rest.
constexpr int64_t kMaxElementBlocks = 65536;

unsigned element_blocks(int64_t count) {
  return static_cast<unsigned>(std::clamp<int64_t>((count + kElementThreads - 1) / kElementThreads, 1, kMaxElementBlocks));
}

// `combine` (sum or max) of `value` over the block (kRowThreads threads), returned to every thread;
// `identity` fills the lanes past the warps.
template <typename Combine>
__device__ float block_reduce(float value, float identity, Combine combine) {
  __shared__ float warp_results[kRowThreads / 32];
  __shared__ float total;
  for (int offset = 16; offset > 0; offset >>= 1) value = combine(value, __shfl_xor_sync(0xffffffffu, value, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_results[warp] = value;
  __syncthreads();
  if (warp == 0) {
    float result = lane < kRowThreads / 32 ? warp_results[lane] : identity;
    for (int offset = 16; offset > 0; offset >>= 1) result = combine(result, __shfl_xor_sync(0xffffffffu, result, offset));
    if (lane == 0) total = result;
  }
  __syncthreads();
  const float result = total;
  __syncthreads();  // the shared slots are reused by the next call
  return result;
}

__device__ float block_sum(float value) {
  return block_reduce(value, 0.0f, [](float a, float b) { return a + b; });
}

__device__ float block_max(float value) {
  return block_reduce(value, 0.0f, [](float a, float b) { return fmaxf(a, b); });
}

__device__ __forceinline__ float modulation_at(const ModulationVector& m, int64_t group, int64_t column) {
  return m.table[column] + m.input[group * m.input_stride + column];
}

__global__ void patchify_kernel(const float* __restrict__ latents, bf16* __restrict__ patches, int64_t batch, int64_t channels,
                                int64_t frames, int64_t height, int64_t width, int64_t pt, int64_t ph, int64_t pw) {
  const int64_t gf = frames / pt, gh = height / ph, gw = width / pw;
  const int64_t patch_len = channels * pt * ph * pw;
  const int64_t count = batch * gf * gh * gw * patch_len;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i % patch_len, row = i / patch_len;
    const int64_t k = rest % pw, j = (rest / pw) % ph, t = (rest / (pw * ph)) % pt, c = rest / (pw * ph * pt);
    const int64_t x = row % gw, y = (row / gw) % gh, f = (row / (gw * gh)) % gf, b = row / (gw * gh * gf);
    patches[i] = __float2bfloat16_rn(latents[(((b * channels + c) * frames + f * pt + t) * height + y * ph + j) * width + x * pw + k]);
  }
}

__global__ void unpatchify_kernel(const float* __restrict__ patches, float* __restrict__ out, int64_t batch, int64_t channels,
                                  int64_t frames, int64_t height, int64_t width, int64_t pt, int64_t ph, int64_t pw) {
  const int64_t gf = frames / pt, gh = height / ph, gw = width / pw;
  const int64_t count = batch * channels * frames * height * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t xx = i % width, yy = (i / width) % height, ff = (i / (width * height)) % frames;
    const int64_t c = (i / (width * height * frames)) % channels, b = i / (width * height * frames * channels);
    const int64_t row = ((b * gf + ff / pt) * gh + yy / ph) * gw + xx / pw;
    const int64_t column = (((ff % pt) * ph + yy % ph) * pw + xx % pw) * channels + c;
    out[i] = patches[row * channels * pt * ph * pw + column];
  }
}

__global__ void convert_to_bf16_kernel(const float* __restrict__ x, bf16* __restrict__ y, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void gelu_to_bf16_kernel(const float* __restrict__ x, bf16* __restrict__ y, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    y[i] = __float2bfloat16_rn(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
  }
}

__global__ void gelu_tanh_bf16_kernel(bf16* __restrict__ x, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = __bfloat162float(x[i]);
    x[i] = __float2bfloat16_rn(0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v))));
  }
}

__global__ void add_bf16_kernel(bf16* __restrict__ x, const bf16* __restrict__ y, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) + __bfloat162float(y[i]));
}

__global__ void add_periodic_rows_kernel(const float* __restrict__ x, const float* __restrict__ table, int64_t rows, int64_t dim,
                                         int64_t period, float* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * dim;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = x[i] + table[(i / dim) % period * dim + i % dim];
}

__global__ void repeat_values_kernel(const float* __restrict__ values, int64_t count, int64_t repeat, float* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count * repeat;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = values[i / repeat];
}

__global__ void silu_kernel(const float* x, float* out, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    out[i] = v / (1.0f + expf(-v));
  }
}

__global__ void sinusoidal_embedding_kernel(const float* __restrict__ values, int64_t count, int64_t channels, float* __restrict__ out) {
  const int64_t half = channels / 2;
  const float log_base = static_cast<float>(-9.210340371976184);  // -ln(10000), rounded to fp32 as PyTorch does
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < count * half;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / half, i = e % half;
    const float frequency = expf(log_base * static_cast<float>(i) / static_cast<float>(half));
    const double angle = static_cast<double>(values[t]) * frequency;
    out[t * channels + i] = static_cast<float>(cos(angle));
    out[t * channels + half + i] = static_cast<float>(sin(angle));
  }
}

__global__ void rope_tables_kernel(int64_t frames, int64_t height, int64_t width, int64_t head_dim, float* __restrict__ cos_out,
                                   float* __restrict__ sin_out) {
  const int64_t pairs = head_dim / 2, tokens = frames * height * width;
  const int64_t spatial_dim = 2 * (head_dim / 6), frame_dim = head_dim - 2 * spatial_dim;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < tokens * pairs;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t token = e / pairs, pair = e % pairs;
    const int64_t x = token % width, y = (token / width) % height, f = token / (width * height);
    int64_t position, j, axis_dim;
    if (pair < frame_dim / 2) {
      position = f, j = pair, axis_dim = frame_dim;
    } else if (pair < frame_dim / 2 + spatial_dim / 2) {
      position = y, j = pair - frame_dim / 2, axis_dim = spatial_dim;
    } else {
      position = x, j = pair - frame_dim / 2 - spatial_dim / 2, axis_dim = spatial_dim;
    }
    const double frequency = 1.0 / pow(10000.0, static_cast<double>(2 * j) / static_cast<double>(axis_dim));
    const double angle = static_cast<double>(position) * frequency;
    cos_out[e] = static_cast<float>(cos(angle));
    sin_out[e] = static_cast<float>(sin(angle));
  }
}

__global__ void layer_norm_kernel(const float* __restrict__ x, bf16* __restrict__ y, int64_t dim, int64_t group_rows, float eps,
                                  const RowNormOutput output) {
  const int64_t row = blockIdx.x;
  const float* in = x + row * dim;
  bf16* out = y + row * dim;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += in[i];
  const float mean = block_sum(sum) / static_cast<float>(dim);
  float squares = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float d = in[i] - mean;
    squares += d * d;
  }
  const float inv_std = rsqrtf(block_sum(squares) / static_cast<float>(dim) + eps);
  const int64_t group = row / group_rows;
  float absmax = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = (in[i] - mean) * inv_std;
    if (output.shift.table != nullptr)
      v = v * (1.0f + modulation_at(output.scale, group, i)) + modulation_at(output.shift, group, i);
    else if (output.weight != nullptr)
      v = v * output.weight[i] + output.bias[i];
    const bf16 stored = __float2bfloat16_rn(v);
    out[i] = stored;
    absmax = fmaxf(absmax, fabsf(__bfloat162float(stored)));
  }
  if (output.fp8 == nullptr) return;
  // The e4m3 row of the bf16 values just stored (each thread reads back its own elements).
  absmax = block_max(absmax);
  const float factor = tessel::cuda::fp8_row_factor(absmax);
  if (threadIdx.x == 0) output.fp8_scales[row] = tessel::cuda::fp8_row_scale(absmax);
  uint8_t* fp8 = output.fp8 + row * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    fp8[i] = __nv_cvt_float_to_fp8(__bfloat162float(out[i]) * factor, __NV_SATFINITE, __NV_E4M3);
}

// One pair's contribution to a row's sum of squares, and the pair (2i, 2i + 1) normalized, times
// the weights w[0], w[1], then rotated by the angle of table entry i (no rotation without a table).
// Both RMSNorm + RoPE kernels compute through these, so their bf16 values are the same bits: the
// explicitly rounded operations keep the compiler from contracting them into FMAs differently in
// the two kernels.
__device__ __forceinline__ float add_pair_squares(float squares, float2 v) {
  return __fadd_rn(squares, __fadd_rn(__fmul_rn(v.x, v.x), __fmul_rn(v.y, v.y)));
}
__device__ __forceinline__ float2 normed_rotated_pair(float2 v, float inv_rms, const float* w, const float* cos_table,
                                                      const float* sin_table, int64_t i) {
  const float a = __fmul_rn(__fmul_rn(v.x, inv_rms), w[0]), b = __fmul_rn(__fmul_rn(v.y, inv_rms), w[1]);
  if (cos_table == nullptr) return float2{a, b};
  const float c = cos_table[i], sn = sin_table[i];
  return float2{__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn)), __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, c))};
}

__global__ void rms_norm_rope_kernel(bf16* __restrict__ x, int64_t seq, int64_t heads, int64_t head_dim, float eps,
                                     const float* __restrict__ weight, const float* __restrict__ cos_table,
                                     const float* __restrict__ sin_table) {
  const int64_t row = blockIdx.x, dim = heads * head_dim, pairs = dim / 2, head_pairs = head_dim / 2;
  __nv_bfloat162* values = reinterpret_cast<__nv_bfloat162*>(x + row * dim);
  float squares = 0.0f;
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) squares = add_pair_squares(squares, __bfloat1622float2(values[p]));
  const float inv_rms = rsqrtf(block_sum(squares) / static_cast<float>(dim) + eps);
  const int64_t s = row % seq;
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x)
    values[p] = __float22bfloat162_rn(
        normed_rotated_pair(__bfloat1622float2(values[p]), inv_rms, weight + 2 * p, cos_table, sin_table, s * head_pairs + p % head_pairs));
}

// The FP8 variant: one CTA of kRowThreads per (64-token block, batch entry), since a q/k scale
// covers the 64 tokens of one head while the norm spans all heads of a token.
//   1. Each row's inverse RMS, 8 rows at a time: the row's pairs summed per thread and folded
//      exactly as block_sum folds them in rms_norm_rope_kernel (warp shuffles, then the 8 warp sums
//      in warp 0's shuffle order), so both kernels get the same bits.
//   2. Head by head, the block's 64 x 128 tile (4 chunks of 8 values per thread, a row's 16 chunks
//      on 16 consecutive threads): normalized, rotated and rounded to bf16 in registers (stored
//      back only when `store_bf16`), the tile's absolute maximum, then the e4m3 bytes of those
//      bf16 values and the block's scale: the bytes fp8_quantize.cu makes of rms_norm_rope_kernel's
//      output, without a pass that reads it again.
// The rows are read twice (phase 2 mostly from L2).
constexpr int kFp8HeadDim = 128;
constexpr int kTokenBlock = 64;  // tessel::kFp8TokenBlock
__global__ void __launch_bounds__(kRowThreads) rms_norm_rope_fp8_kernel(bf16* __restrict__ x, int64_t seq, int64_t heads, float eps,
                                                                        const float* __restrict__ weight,
                                                                        const float* __restrict__ cos_table,
                                                                        const float* __restrict__ sin_table, bool store_bf16,
                                                                        uint8_t* __restrict__ fp8, float* __restrict__ scales) {
  constexpr int kWarps = kRowThreads / 32, kGroupRows = 8;
  static_assert(kWarps == 8, "the fold below is block_sum's for 8 warps");
  __shared__ float inv_rms[kTokenBlock];
  __shared__ float warp_squares[kGroupRows][kWarps];
  const int64_t dim = heads * kFp8HeadDim, pairs = dim / 2, head_pairs = kFp8HeadDim / 2;
  const int64_t block = blockIdx.x, batch = blockIdx.y, blocks = gridDim.x, s0 = block * kTokenBlock;
  const int rows = static_cast<int>(seq - s0 < kTokenBlock ? seq - s0 : kTokenBlock);
  bf16* const base = x + (batch * seq + s0) * dim;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r0 = 0; r0 < rows; r0 += kGroupRows) {
    float squares[kGroupRows];
#pragma unroll
    for (int g = 0; g < kGroupRows; ++g) {
      squares[g] = 0.0f;
      if (r0 + g >= rows) continue;
      const __nv_bfloat162* values = reinterpret_cast<const __nv_bfloat162*>(base + (r0 + g) * dim);
      for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) squares[g] = add_pair_squares(squares[g], __bfloat1622float2(values[p]));
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) squares[g] += __shfl_xor_sync(0xffffffffu, squares[g], offset);
      if (lane == 0) warp_squares[g][warp] = squares[g];
    }
    __syncthreads();
    if (threadIdx.x < kGroupRows && r0 + static_cast<int>(threadIdx.x) < rows) {
      // block_sum's second stage: lanes 0..7 hold the warp sums, the others 0; xor 16 and 8 add
      // zeros, then xor 4, 2, 1.
      const float* w = warp_squares[threadIdx.x];
      const float total = ((w[0] + w[4]) + (w[2] + w[6])) + ((w[1] + w[5]) + (w[3] + w[7]));
      inv_rms[r0 + threadIdx.x] = rsqrtf(total / static_cast<float>(dim) + eps);
    }
    __syncthreads();
  }
  constexpr int kChunksPerRow = kFp8HeadDim / 8;
  constexpr int kThreadChunks = kTokenBlock * kChunksPerRow / kRowThreads;
  for (int64_t h = 0; h < heads; ++h) {
    uint4 tile[kThreadChunks];
    float absmax = 0.0f;
#pragma unroll
    for (int i = 0; i < kThreadChunks; ++i) {
      const int c = static_cast<int>(threadIdx.x) + i * kRowThreads, r = c / kChunksPerRow, chunk = c % kChunksPerRow;
      tile[i] = make_uint4(0, 0, 0, 0);
      if (r >= rows) continue;
      uint4* const at = reinterpret_cast<uint4*>(base + r * dim + h * kFp8HeadDim + chunk * 8);
      const uint4 raw = *at;
      const __nv_bfloat162* in = reinterpret_cast<const __nv_bfloat162*>(&raw);
      __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(&tile[i]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t pair = chunk * 4 + j;  // within the head
        out[j] = __float22bfloat162_rn(normed_rotated_pair(__bfloat1622float2(in[j]), inv_rms[r], weight + 2 * (h * head_pairs + pair),
                                                           cos_table, sin_table, (s0 + r) * head_pairs + pair));
        const float2 rounded = __bfloat1622float2(out[j]);
        absmax = fmaxf(absmax, fmaxf(fabsf(rounded.x), fabsf(rounded.y)));
      }
      if (store_bf16) *at = tile[i];
    }
    absmax = block_max(absmax);
    const float factor = tessel::cuda::fp8_row_factor(absmax);
    if (threadIdx.x == 0) scales[(batch * heads + h) * blocks + block] = tessel::cuda::fp8_row_scale(absmax);
#pragma unroll
    for (int i = 0; i < kThreadChunks; ++i) {
      const int c = static_cast<int>(threadIdx.x) + i * kRowThreads, r = c / kChunksPerRow, chunk = c % kChunksPerRow;
      if (r >= rows) continue;
      const __nv_bfloat162* v = reinterpret_cast<const __nv_bfloat162*>(&tile[i]);
      uint32_t words[2];
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        const float2 lo = __bfloat1622float2(v[2 * w]), hi = __bfloat1622float2(v[2 * w + 1]);
        words[w] = __nv_cvt_float2_to_fp8x2(make_float2(lo.x * factor, lo.y * factor), __NV_SATFINITE, __NV_E4M3) |
                   (static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(make_float2(hi.x * factor, hi.y * factor), __NV_SATFINITE,
                                                                   __NV_E4M3))
                    << 16);
      }
      *reinterpret_cast<uint2*>(fp8 + ((batch * seq + s0 + r) * heads + h) * kFp8HeadDim + chunk * 8) = make_uint2(words[0], words[1]);
    }
  }
}

__global__ void gated_residual_kernel(float* __restrict__ x, const bf16* __restrict__ y, int64_t rows, int64_t dim,
                                      int64_t group_rows, const ModulationVector gate) {
  const int64_t count = rows * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float update = __bfloat162float(y[i]);
    if (gate.table == nullptr) {
      x[i] += update;
    } else {
      const int64_t row = i / dim, column = i % dim;
      x[i] += update * modulation_at(gate, row / group_rows, column);
    }
  }
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in (0, 1] from the top 24 bits of a hash (never 0, so its log is finite).
__device__ __forceinline__ float unit_uniform(uint64_t hash) { return (static_cast<float>(hash >> 40) + 1.0f) * (1.0f / 16777216.0f); }

__global__ void fill_random_kernel(void* data, bool bf16_elements, int64_t count, uint64_t seed, bool normal, float low, float high) {
  const uint64_t stream = splitmix64(seed);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u = unit_uniform(splitmix64(stream ^ (2 * static_cast<uint64_t>(i))));
    float value;
    if (normal) {
      const float u2 = unit_uniform(splitmix64(stream ^ (2 * static_cast<uint64_t>(i) + 1)));
      value = low + high * sqrtf(-2.0f * logf(u)) * cospif(2.0f * u2);
    } else {
      value = low + (high - low) * (1.0f - u);
    }
    if (bf16_elements)
      static_cast<bf16*>(data)[i] = __float2bfloat16_rn(value);
    else
      static_cast<float*>(data)[i] = value;
  }
}

}  // namespace

void launch_patchify(const float* latents, bf16* patches, int64_t batch, int64_t channels, int64_t frames, int64_t height,
                     int64_t width, int64_t pt, int64_t ph, int64_t pw, cudaStream_t stream) {
  const int64_t count = batch * channels * frames * height * width;
  patchify_kernel<<<element_blocks(count), kElementThreads, 0, stream>>>(latents, patches, batch, channels, frames, height, width,
                                                                         pt, ph, pw);
}

void launch_unpatchify(const float* patches, float* out, int64_t batch, int64_t channels, int64_t frames, int64_t height,
                       int64_t width, int64_t pt, int64_t ph, int64_t pw, cudaStream_t stream) {
  const int64_t count = batch * channels * frames * height * width;
  unpatchify_kernel<<<element_blocks(count), kElementThreads, 0, stream>>>(patches, out, batch, channels, frames, height, width,
                                                                           pt, ph, pw);
}

void launch_convert_to_bf16(const float* x, bf16* y, int64_t count, cudaStream_t stream) {
  convert_to_bf16_kernel<<<element_blocks(count), kElementThreads, 0, stream>>>(x, y, count);
}

void launch_gelu_tanh_bf16(bf16* x, int64_t count, cudaStream_t stream) {
  gelu_tanh_bf16_kernel<<<element_blocks(count), kElementThreads, 0, stream>>>(x, count);
}

void launch_gelu_to_bf16(const float* x, bf16* y, int64_t count, cudaStream_t stream) {
  gelu_to_bf16_kernel<<<element_blocks(count), kElementThreads, 0, stream>>>(x, y, count);
}

void launch_add_bf16(bf16* x, const bf16* y, int64_t count, cudaStream_t stream) {
  add_bf16_kernel<<<element_blocks(count), kElementThreads, 0, stream>>>(x, y, count);
}

void launch_add_periodic_rows(const float* x, const float* table, int64_t rows, int64_t dim, int64_t period, float* out,
                              cudaStream_t stream) {
  add_periodic_rows_kernel<<<element_blocks(rows * dim), kElementThreads, 0, stream>>>(x, table, rows, dim, period, out);
}

void launch_repeat_values(const float* values, int64_t count, int64_t repeat, float* out, cudaStream_t stream) {
  repeat_values_kernel<<<element_blocks(count * repeat), kElementThreads, 0, stream>>>(values, count, repeat, out);
}

void launch_silu(const float* x, float* out, int64_t count, cudaStream_t stream) {
  silu_kernel<<<element_blocks(count), kElementThreads, 0, stream>>>(x, out, count);
}

void launch_sinusoidal_embedding(const float* values, int64_t count, int64_t channels, float* out, cudaStream_t stream) {
  sinusoidal_embedding_kernel<<<element_blocks(count * (channels / 2)), kElementThreads, 0, stream>>>(values, count, channels, out);
}

void launch_wan_rope_tables(int64_t frames, int64_t height, int64_t width, int64_t head_dim, float* cos, float* sin,
                            cudaStream_t stream) {
  const int64_t count = frames * height * width * (head_dim / 2);
  rope_tables_kernel<<<element_blocks(count), kElementThreads, 0, stream>>>(frames, height, width, head_dim, cos, sin);
}

void launch_layer_norm(const float* x, bf16* y, int64_t rows, int64_t dim, int64_t group_rows, float eps,
                       const RowNormOutput& output, cudaStream_t stream) {
  if (rows == 0) return;
  layer_norm_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(x, y, dim, group_rows, eps, output);
}

void launch_rms_norm_rope(bf16* x, int64_t rows, int64_t seq, int64_t heads, int64_t head_dim, float eps, const float* weight,
                          const float* cos, const float* sin, cudaStream_t stream) {
  if (rows == 0) return;
  rms_norm_rope_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(x, seq, heads, head_dim, eps, weight, cos, sin);
}

void launch_rms_norm_rope_fp8(bf16* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, float eps,
                              const float* weight, const float* cos, const float* sin, bool store_bf16, const Fp8TokenBlocks& fp8,
                              cudaStream_t stream) {
  if (head_dim != kFp8HeadDim)
    throw Error(tessel::detail::concat("RMSNorm + RoPE into FP8 attention operands: head dim ", head_dim, ", expected ", kFp8HeadDim));
  if (batch == 0 || seq == 0) return;
  const dim3 grid(static_cast<unsigned>((seq + kTokenBlock - 1) / kTokenBlock), static_cast<unsigned>(batch));
  rms_norm_rope_fp8_kernel<<<grid, kRowThreads, 0, stream>>>(x, seq, heads, eps, weight, cos, sin, store_bf16, fp8.values, fp8.scales);
}

void launch_gated_residual(float* x, const bf16* y, int64_t rows, int64_t dim, int64_t group_rows, const ModulationVector& gate,
                           cudaStream_t stream) {
  gated_residual_kernel<<<element_blocks(rows * dim), kElementThreads, 0, stream>>>(x, y, rows, dim, group_rows, gate);
}

void launch_fill_random(void* data, bool bf16_elements, int64_t count, uint64_t seed, bool normal, float low, float high,
                        cudaStream_t stream) {
  fill_random_kernel<<<element_blocks(count), kElementThreads, 0, stream>>>(data, bf16_elements, count, seed, normal, low, high);
}

}  // namespace tessel::dit::cuda
