// The CLIP vision encoder's CUDA kernels (see clip_kernels.h). The attention is small (257 tokens
// of head dim 80 for ViT-H/14, a few hundred MFLOP per layer) and in fp32, which the flash kernels
// (bf16 / fp16, head dims 64 / 96 / 128 / ...) do not take: one block per (image, head, 16
// queries) streams the keys and values through shared memory in tiles of 32 with an online
// softmax, one warp per 4 queries, one lane per key of the tile for the scores and per 32 output
// channels for the values.
#include "cuda/clip_kernels.h"

#include <cmath>

#include "cuda/grid_stride.h"

namespace tessel::diffusion::cuda {
namespace {

__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The sum of every thread's v, in all threads of the block (blockDim.x a multiple of 32).
__device__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  return total;
}

__global__ void patch_rows_kernel(const float* pixels, float* rows, int64_t batch, int64_t channels, int64_t image_size,
                                  int64_t patch) {
  const int64_t side = image_size / patch, patches = side * side, values = channels * patch * patch;
  TESSEL_GRID_STRIDE(i, batch * patches * values) {
    const int64_t item = i / values, within = i % values;
    const int64_t b = item / patches, py = item % patches / side, px = item % side;
    const int64_t channel = within / (patch * patch), y = within / patch % patch, x = within % patch;
    rows[i] = pixels[((b * channels + channel) * image_size + py * patch + y) * image_size + px * patch + x];
  }
}

__global__ void embed_kernel(const float* patches, const float* class_embedding, const float* position, float* hidden, int64_t batch,
                             int64_t tokens, int64_t width) {
  TESSEL_GRID_STRIDE(i, batch * tokens * width) {
    const int64_t row = i / width, c = i % width, b = row / tokens, t = row % tokens;
    const float source = t == 0 ? class_embedding[c] : patches[(b * (tokens - 1) + t - 1) * width + c];
    hidden[i] = source + position[t * width + c];
  }
}

__global__ void layer_norm_kernel(const float* x, const float* weight, const float* bias, float* y, int64_t width, float eps) {
  __shared__ float scratch[32];
  const float* in = x + blockIdx.x * width;
  float* out = y + blockIdx.x * width;
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) sum += in[c];
  const float mean = block_sum(sum, scratch) / static_cast<float>(width);
  float squares = 0.0f;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
    const float d = in[c] - mean;
    squares = fmaf(d, d, squares);
  }
  const float inverse = rsqrtf(block_sum(squares, scratch) / static_cast<float>(width) + eps);
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) out[c] = (in[c] - mean) * inverse * weight[c] + bias[c];
}

__global__ void activation_kernel(float* x, int64_t count, bool quick) {
  TESSEL_GRID_STRIDE(i, count) {
    const float v = x[i];
    x[i] = quick ? v / (1.0f + expf(-1.702f * v)) : 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
  }
}

constexpr int kAttentionQueries = 16, kKeyTile = 32, kAttentionWarps = 4;
constexpr int kQueriesPerWarp = kAttentionQueries / kAttentionWarps;
constexpr int kChannelsPerLane = static_cast<int>(kMaxClipHeadDim / 32);

__global__ void __launch_bounds__(kAttentionWarps * 32) attention_kernel(const float* qkv, int64_t stride, float* out, int tokens,
                                                                         int heads, int head_dim, float scale) {
  extern __shared__ float shared[];
  const int padded = head_dim + 1;  // the keys' rows padded by one: lanes read one key each without bank conflicts
  float* q_tile = shared;                                 // kAttentionQueries x head_dim
  float* k_tile = q_tile + kAttentionQueries * head_dim;  // kKeyTile x padded
  float* v_tile = k_tile + kKeyTile * padded;             // kKeyTile x head_dim
  const int b = blockIdx.z, h = blockIdx.y, first_query = blockIdx.x * kAttentionQueries;
  const int64_t width = static_cast<int64_t>(heads) * head_dim;
  const float* rows = qkv + static_cast<int64_t>(b) * tokens * stride + static_cast<int64_t>(h) * head_dim;
  for (int i = threadIdx.x; i < kAttentionQueries * head_dim; i += blockDim.x) {
    const int query = first_query + i / head_dim;
    q_tile[i] = query < tokens ? rows[query * stride + i % head_dim] : 0.0f;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float running_max[kQueriesPerWarp], running_sum[kQueriesPerWarp], acc[kQueriesPerWarp][kChannelsPerLane];
  for (int q = 0; q < kQueriesPerWarp; ++q) {
    running_max[q] = -INFINITY;
    running_sum[q] = 0.0f;
    for (int c = 0; c < kChannelsPerLane; ++c) acc[q][c] = 0.0f;
  }
  for (int first_key = 0; first_key < tokens; first_key += kKeyTile) {
    __syncthreads();  // the previous tile is read by every warp before it is overwritten
    for (int i = threadIdx.x; i < kKeyTile * head_dim; i += blockDim.x) {
      const int j = i / head_dim, d = i % head_dim, key = first_key + j;
      k_tile[j * padded + d] = key < tokens ? rows[key * stride + width + d] : 0.0f;
      v_tile[i] = key < tokens ? rows[key * stride + 2 * width + d] : 0.0f;
    }
    __syncthreads();
    const bool valid = first_key + lane < tokens;
    for (int q = 0; q < kQueriesPerWarp; ++q) {
      const float* query = q_tile + (warp * kQueriesPerWarp + q) * head_dim;
      float score = 0.0f;
      for (int d = 0; d < head_dim; ++d) score = fmaf(query[d], k_tile[lane * padded + d], score);
      score = valid ? score * scale : -INFINITY;
      const float tile_max = warp_max(score);  // finite: the tile's first key is a token
      const float new_max = fmaxf(running_max[q], tile_max);
      const float correction = expf(running_max[q] - new_max);
      const float p = valid ? expf(score - new_max) : 0.0f;
      running_sum[q] = running_sum[q] * correction + warp_sum(p);
      for (int c = 0; c < kChannelsPerLane; ++c) acc[q][c] *= correction;
      for (int j = 0; j < kKeyTile; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
        for (int c = 0; c < kChannelsPerLane; ++c) {
          const int d = lane + 32 * c;
          if (d < head_dim) acc[q][c] = fmaf(pj, v_tile[j * head_dim + d], acc[q][c]);
        }
      }
      running_max[q] = new_max;
    }
  }
  for (int q = 0; q < kQueriesPerWarp; ++q) {
    const int query = first_query + warp * kQueriesPerWarp + q;
    if (query >= tokens) continue;
    float* target = out + (static_cast<int64_t>(b) * tokens + query) * width + static_cast<int64_t>(h) * head_dim;
    const float inverse = 1.0f / running_sum[q];
    for (int c = 0; c < kChannelsPerLane; ++c) {
      const int d = lane + 32 * c;
      if (d < head_dim) target[d] = acc[q][c] * inverse;
    }
  }
}

}  // namespace

void launch_clip_patch_rows(const float* pixels, float* rows, int64_t batch, int64_t channels, int64_t image_size, int64_t patch,
                            cudaStream_t stream) {
  patch_rows_kernel<<<grid_blocks(batch * channels * image_size * image_size), kGridThreads, 0, stream>>>(pixels, rows, batch, channels,
                                                                                                   image_size, patch);
}

void launch_clip_embed(const float* patches, const float* class_embedding, const float* position, float* hidden, int64_t batch,
                       int64_t tokens, int64_t width, cudaStream_t stream) {
  embed_kernel<<<grid_blocks(batch * tokens * width), kGridThreads, 0, stream>>>(patches, class_embedding, position, hidden, batch, tokens,
                                                                           width);
}

void launch_clip_layer_norm(const float* x, const float* weight, const float* bias, float* y, int64_t rows, int64_t width, float eps,
                            cudaStream_t stream) {
  layer_norm_kernel<<<static_cast<unsigned>(rows), kGridThreads, 0, stream>>>(x, weight, bias, y, width, eps);
}

void launch_clip_activation(float* x, int64_t count, bool quick, cudaStream_t stream) {
  activation_kernel<<<grid_blocks(count), kGridThreads, 0, stream>>>(x, count, quick);
}

void launch_clip_attention(const float* qkv, int64_t qkv_stride, float* out, int64_t batch, int64_t tokens, int64_t heads,
                           int64_t head_dim, float scale, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((tokens + kAttentionQueries - 1) / kAttentionQueries), static_cast<unsigned>(heads),
                  static_cast<unsigned>(batch));
  const size_t shared = static_cast<size_t>(kAttentionQueries * head_dim + kKeyTile * (head_dim + 1) + kKeyTile * head_dim) * sizeof(float);
  attention_kernel<<<grid, kAttentionWarps * 32, shared, stream>>>(qkv, qkv_stride, out, static_cast<int>(tokens), static_cast<int>(heads),
                                                                   static_cast<int>(head_dim), scale);
}

}  // namespace tessel::diffusion::cuda
