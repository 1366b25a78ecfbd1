// The Wan forward's element-wise and row-wise kernels (see wan_kernels.h). Row kernels run one
// block per row and reduce in fp32 through warp shuffles; element kernels use grid-stride loops.
#include "cuda/wan_kernels.h"

#include <cuda_fp8.h>

#include <algorithm>

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

__global__ void rms_norm_rope_kernel(bf16* __restrict__ x, int64_t seq, int64_t heads, int64_t head_dim, float eps,
                                     const float* __restrict__ weight, const float* __restrict__ cos_table,
                                     const float* __restrict__ sin_table) {
  const int64_t row = blockIdx.x, dim = heads * head_dim, pairs = dim / 2, head_pairs = head_dim / 2;
  __nv_bfloat162* values = reinterpret_cast<__nv_bfloat162*>(x + row * dim);
  float squares = 0.0f;
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const float2 v = __bfloat1622float2(values[p]);
    squares += v.x * v.x + v.y * v.y;
  }
  const float inv_rms = rsqrtf(block_sum(squares) / static_cast<float>(dim) + eps);
  const int64_t s = row % seq;
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const float2 v = __bfloat1622float2(values[p]);
    const float a = v.x * inv_rms * weight[2 * p], b = v.y * inv_rms * weight[2 * p + 1];
    float2 result{a, b};
    if (cos_table != nullptr) {
      const int64_t i = s * head_pairs + p % head_pairs;
      const float c = cos_table[i], sn = sin_table[i];
      result = float2{a * c - b * sn, a * sn + b * c};
    }
    values[p] = __float22bfloat162_rn(result);
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

void launch_gated_residual(float* x, const bf16* y, int64_t rows, int64_t dim, int64_t group_rows, const ModulationVector& gate,
                           cudaStream_t stream) {
  gated_residual_kernel<<<element_blocks(rows * dim), kElementThreads, 0, stream>>>(x, y, rows, dim, group_rows, gate);
}

void launch_fill_random(void* data, bool bf16_elements, int64_t count, uint64_t seed, bool normal, float low, float high,
                        cudaStream_t stream) {
  fill_random_kernel<<<element_blocks(count), kElementThreads, 0, stream>>>(data, bf16_elements, count, seed, normal, low, high);
}

}  // namespace tessel::dit::cuda
