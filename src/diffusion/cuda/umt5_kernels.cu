#include "cuda/umt5_kernels.h"

#include <algorithm>
#include <cmath>

namespace tessel::diffusion::cuda {
namespace {

constexpr int kElementThreads = 256;
constexpr int kRowThreads = 256;

unsigned element_blocks(int64_t count) {
  return static_cast<unsigned>(std::min<int64_t>((count + kElementThreads - 1) / kElementThreads, 65535 * 8));
}

#define TESSEL_GRID_STRIDE(i, count) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (count); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void embedding_gather_kernel(const int32_t* ids, const bf16* table, float* hidden, int64_t rows, int64_t width) {
  TESSEL_GRID_STRIDE(i, rows * width) {
    const int64_t row = i / width, column = i % width;
    hidden[i] = __bfloat162float(table[static_cast<int64_t>(ids[row]) * width + column]);
  }
}

__global__ void t5_rms_norm_kernel(const float* x, const float* weight, bf16* y_bf16, float* y_f32, int64_t width, float eps) {
  const float* row = x + blockIdx.x * width;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) sum += row[i] * row[i];
  __shared__ float partial[kRowThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kRowThreads / 32; ++w) total += partial[w];
  const float scale = rsqrtf(total / static_cast<float>(width) + eps);
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    const float value = weight[i] * (row[i] * scale);
    if (y_bf16 != nullptr)
      y_bf16[blockIdx.x * width + i] = __float2bfloat16(value);
    else
      y_f32[blockIdx.x * width + i] = value;
  }
}

__global__ void gated_product_kernel(bf16* gate, const bf16* up, int64_t count) {
  TESSEL_GRID_STRIDE(i, count) gate[i] = __float2bfloat16(__bfloat162float(gate[i]) * __bfloat162float(up[i]));
}

// Flash-style attention in fp32 on the SIMT cores (T5's bias rules out the tensor-core kernels and
// the encoder's sequences are short): a block takes kQueryTile queries of one (batch, head), four
// threads per query, and walks the keys kKeyTile at a time with an online softmax. Each thread
// scores every fourth key of the tile and accumulates every fourth output dimension.
constexpr int kQueryTile = 32;
constexpr int kKeyTile = 64;
constexpr int kThreadsPerQuery = 4;
constexpr int kAttentionThreads = kQueryTile * kThreadsPerQuery;
constexpr int kKeysPerThread = kKeyTile / kThreadsPerQuery;
constexpr int kDimsPerThread = static_cast<int>(kMaxT5HeadDim) / kThreadsPerQuery;

size_t attention_shared_bytes(int64_t head_dim) {
  const int64_t stride = head_dim + 1;  // padded rows: the four threads of a query read other banks
  return static_cast<size_t>(((kQueryTile + 2 * kKeyTile) * stride + kQueryTile * (kKeyTile + 1)) * sizeof(float));
}

__global__ void __launch_bounds__(kAttentionThreads) t5_attention_kernel(const bf16* q, const bf16* k, const bf16* v, const float* bias,
                                                                         const int32_t* bucket, const int32_t* mask, bf16* out,
                                                                         int length, int heads, int head_dim) {
  extern __shared__ float shared[];
  const int stride = head_dim + 1;
  float* q_tile = shared;
  float* k_tile = q_tile + kQueryTile * stride;
  float* v_tile = k_tile + kKeyTile * stride;
  float* p_tile = v_tile + kKeyTile * stride;  // (kQueryTile, kKeyTile + 1)
  const int b = blockIdx.z, h = blockIdx.y, first_query = blockIdx.x * kQueryTile;
  const int64_t inner = static_cast<int64_t>(heads) * head_dim;
  const int t = threadIdx.x, local = t / kThreadsPerQuery, part = t % kThreadsPerQuery;
  const int query = first_query + local;

  for (int idx = t; idx < kQueryTile * head_dim; idx += kAttentionThreads) {
    const int row = idx / head_dim, d = idx % head_dim, i = first_query + row;
    q_tile[row * stride + d] = i < length ? __bfloat162float(q[(static_cast<int64_t>(b) * length + i) * inner + h * head_dim + d]) : 0.0f;
  }
  float running_max = -INFINITY, running_sum = 0.0f;
  float acc[kDimsPerThread];
  for (float& a : acc) a = 0.0f;

  for (int first_key = 0; first_key < length; first_key += kKeyTile) {
    __syncthreads();  // the previous tile's keys and values are no longer read
    for (int idx = t; idx < kKeyTile * head_dim; idx += kAttentionThreads) {
      const int row = idx / head_dim, d = idx % head_dim, j = first_key + row;
      const int64_t at = (static_cast<int64_t>(b) * length + j) * inner + h * head_dim + d;
      k_tile[row * stride + d] = j < length ? __bfloat162float(k[at]) : 0.0f;
      v_tile[row * stride + d] = j < length ? __bfloat162float(v[at]) : 0.0f;
    }
    __syncthreads();
    float scores[kKeysPerThread];
    float tile_max = -INFINITY;
    for (int n = 0; n < kKeysPerThread; ++n) {
      const int row = part + kThreadsPerQuery * n, j = first_key + row;
      float score = -INFINITY;
      if (query < length && j < length && mask[static_cast<int64_t>(b) * length + j] != 0) {
        float dot = 0.0f;
        for (int d = 0; d < head_dim; ++d) dot += q_tile[local * stride + d] * k_tile[row * stride + d];
        score = dot + bias[bucket[j - query + length - 1] * heads + h];
      }
      scores[n] = score;
      tile_max = fmaxf(tile_max, score);
    }
    // The four threads of a query are adjacent lanes of one warp.
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    const float new_max = fmaxf(running_max, tile_max);
    const float rescale = new_max == -INFINITY ? 1.0f : __expf(running_max - new_max);
    running_sum *= rescale;
    for (float& a : acc) a *= rescale;
    for (int n = 0; n < kKeysPerThread; ++n) {
      const float p = scores[n] == -INFINITY ? 0.0f : __expf(scores[n] - new_max);
      running_sum += p;
      p_tile[local * (kKeyTile + 1) + part + kThreadsPerQuery * n] = p;
    }
    running_max = new_max;
    __syncwarp();
    for (int u = 0; u < kDimsPerThread; ++u) {
      const int d = part + kThreadsPerQuery * u;
      if (d >= head_dim) break;
      float sum = 0.0f;
      for (int row = 0; row < kKeyTile; ++row) sum += p_tile[local * (kKeyTile + 1) + row] * v_tile[row * stride + d];
      acc[u] += sum;
    }
  }
  running_sum += __shfl_xor_sync(0xffffffffu, running_sum, 1);
  running_sum += __shfl_xor_sync(0xffffffffu, running_sum, 2);
  if (query >= length) return;
  const float inverse = running_sum > 0.0f ? 1.0f / running_sum : 0.0f;
  for (int u = 0; u < kDimsPerThread; ++u) {
    const int d = part + kThreadsPerQuery * u;
    if (d >= head_dim) break;
    out[(static_cast<int64_t>(b) * length + query) * inner + h * head_dim + d] = __float2bfloat16(acc[u] * inverse);
  }
}

}  // namespace

void launch_embedding_gather(const int32_t* ids, const bf16* table, float* hidden, int64_t rows, int64_t width, cudaStream_t stream) {
  embedding_gather_kernel<<<element_blocks(rows * width), kElementThreads, 0, stream>>>(ids, table, hidden, rows, width);
}

void launch_t5_rms_norm(const float* x, const float* weight, bf16* y_bf16, float* y_f32, int64_t rows, int64_t width, float eps,
                        cudaStream_t stream) {
  if (rows == 0) return;
  t5_rms_norm_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(x, weight, y_bf16, y_f32, width, eps);
}

void launch_gated_product(bf16* gate, const bf16* up, int64_t count, cudaStream_t stream) {
  gated_product_kernel<<<element_blocks(count), kElementThreads, 0, stream>>>(gate, up, count);
}

void launch_t5_attention(const bf16* q, const bf16* k, const bf16* v, const float* bias, const int32_t* bucket, const int32_t* mask,
                         bf16* out, int64_t batch, int64_t length, int64_t heads, int64_t head_dim, cudaStream_t stream) {
  if (batch == 0 || length == 0) return;
  const size_t shared = attention_shared_bytes(head_dim);
  // Above the 48 KiB default from head_dim 64 on; the attribute is per kernel and per device.
  cudaFuncSetAttribute(t5_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  const dim3 grid(static_cast<unsigned>((length + kQueryTile - 1) / kQueryTile), static_cast<unsigned>(heads), static_cast<unsigned>(batch));
  t5_attention_kernel<<<grid, kAttentionThreads, shared, stream>>>(q, k, v, bias, bucket, mask, out, static_cast<int>(length),
                                                                   static_cast<int>(heads), static_cast<int>(head_dim));
}

}  // namespace tessel::diffusion::cuda
