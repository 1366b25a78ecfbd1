// dynamic_topk mask estimation on the device. Same arithmetic as the CPU estimator (fp32 after
// converting the inputs); only summation orders differ, so blocks whose probabilities tie within
// rounding may be ordered differently.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/mask_rows.cuh"
#include "tessel/kernels/cuda/topk_estimation.h"

namespace tessel::cuda::detail {

namespace {

constexpr int kPoolWarps = 4;
constexpr int kMaxDimPerLane = 8;  // dim <= 256
constexpr int kRowThreads = 256;

__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

constexpr int kMeanThreads = 256;

// Two passes so the sum over a long sequence runs on many CTAs yet in a fixed order (the same
// mean on every replay). Pass 1, one CTA per (chunk, head h, batch b): partial[chunk][d] =
// Σ over the chunk's tokens of x_t[d]; thread i sums dim i % dim over tokens t ≡ i / dim
// (mod kMeanThreads / dim), then the threads' sums are added in a fixed order.
template <typename T>
__global__ void sequence_partial_sum_kernel(const T* x, int64_t stride_b, int64_t stride_s, int64_t stride_h, int seq,
                                            int heads, int dim, float* partial) {
  __shared__ float s_sum[kMeanThreads];
  const int chunk = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int chunk_len = (seq + kTopkMeanChunks - 1) / kTopkMeanChunks;
  const int begin = chunk * chunk_len, end = min(seq, begin + chunk_len);
  const int lanes = kMeanThreads / dim * dim, token_step = kMeanThreads / dim;
  const T* base = x + b * stride_b + h * stride_h;
  float sum = 0.f;
  if (tid < lanes)
    for (int t = begin + tid / dim; t < end; t += token_step) sum += to_f32(base[static_cast<int64_t>(t) * stride_s + tid % dim]);
  s_sum[tid] = sum;
  __syncthreads();
  const int64_t heads_total = static_cast<int64_t>(gridDim.z) * heads;
  for (int d = tid; d < dim; d += kMeanThreads) {
    float total = 0.f;
    for (int i = d; i < lanes; i += dim) total += s_sum[i];
    partial[((static_cast<int64_t>(chunk) * heads_total) + static_cast<int64_t>(b) * heads + h) * dim + d] = total;
  }
}

// Pass 2, one CTA per (head h, batch b): mean[d] = (Σ_chunk partial[chunk][d]) / seq, chunks in order.
__global__ void sequence_mean_kernel(const float* partial, int seq, int heads, int dim, float* mean) {
  const int h = blockIdx.x, b = blockIdx.y;
  const int64_t heads_total = static_cast<int64_t>(gridDim.y) * heads, row = static_cast<int64_t>(b) * heads + h;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float total = 0.f;
    for (int chunk = 0; chunk < kTopkMeanChunks; ++chunk) total += partial[(chunk * heads_total + row) * dim + d];
    mean[row * dim + d] = total / static_cast<float>(seq);
  }
}

// One CTA per (block c, head h, batch b): the block's mean vector and its self-similarity
// (1/n²)‖Σ_t x_t/‖x_t‖‖², compared with the threshold. Each warp takes every 4th token; lane l
// holds dims l, l + 32, ...
// kSmooth: x_t is shifted by the head's `mean_of_head` first (K smoothing). kWholeBlocksOnly: a
// partial block or one with a zero-norm token is not self-similar. Both are template arguments so
// that the kernel without them carries none of their instructions (the shift, the zero-token flag
// and its barrier): with both off it is the plain pooling kernel.
template <typename T, bool kSmooth, bool kWholeBlocksOnly>
__global__ void pool_blocks_kernel(const T* x, int64_t stride_b, int64_t stride_s, int64_t stride_h, int seq, int block,
                                   int blocks, int heads, int dim, float threshold, const float* mean_of_head,
                                   float* pooled, uint8_t* similar) {
  __shared__ float s_mean[kPoolWarps][kMaxDimPerLane * 32];
  __shared__ float s_unit[kPoolWarps][kMaxDimPerLane * 32];
  __shared__ float s_partial[kPoolWarps];
  __shared__ int s_zero_token;
  const int c = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int lo = c * block, hi = min(seq, lo + block), n = hi - lo;
  const int per_lane = dim >> 5;
  const T* base = x + b * stride_b + h * stride_h;
  const float* shift = nullptr;
  if constexpr (kSmooth) shift = mean_of_head + (static_cast<int64_t>(b) * heads + h) * dim;
  if constexpr (kWholeBlocksOnly) {
    if (threadIdx.x == 0) s_zero_token = 0;
    __syncthreads();
  }
  float mean[kMaxDimPerLane], unit[kMaxDimPerLane];
#pragma unroll
  for (int j = 0; j < kMaxDimPerLane; ++j) mean[j] = unit[j] = 0.f;
  for (int t = lo + warp; t < hi; t += kPoolWarps) {
    float v[kMaxDimPerLane];
    float sq = 0.f;
#pragma unroll
    for (int j = 0; j < kMaxDimPerLane; ++j) {
      if constexpr (kSmooth)
        v[j] = j < per_lane ? to_f32(base[static_cast<int64_t>(t) * stride_s + lane + 32 * j]) - shift[lane + 32 * j] : 0.f;
      else
        v[j] = j < per_lane ? to_f32(base[static_cast<int64_t>(t) * stride_s + lane + 32 * j]) : 0.f;
      sq += v[j] * v[j];
    }
    const float norm = sqrtf(warp_sum(sq));
    if constexpr (kWholeBlocksOnly)
      if (norm == 0.f && lane == 0) s_zero_token = 1;
    const float inv = norm > 0.f ? 1.f / norm : 0.f;
#pragma unroll
    for (int j = 0; j < kMaxDimPerLane; ++j) {
      mean[j] += v[j];
      unit[j] += v[j] * inv;
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxDimPerLane; ++j) {
    s_mean[warp][lane + 32 * j] = mean[j];
    s_unit[warp][lane + 32 * j] = unit[j];
  }
  __syncthreads();
  float sim_part = 0.f;
  const int64_t out_row = (static_cast<int64_t>(b) * heads + h) * blocks + c;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float m = 0.f, u = 0.f;
#pragma unroll
    for (int w = 0; w < kPoolWarps; ++w) {
      m += s_mean[w][d];
      u += s_unit[w][d];
    }
    pooled[out_row * dim + d] = m / static_cast<float>(n);
    sim_part += u * u;
  }
  sim_part = warp_sum(sim_part);
  if (lane == 0) s_partial[warp] = sim_part;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sim = 0.f;
    for (int w = 0; w < kPoolWarps; ++w) sim += s_partial[w];
    sim /= static_cast<float>(n) * static_cast<float>(n);
    bool judged = true;
    if constexpr (kWholeBlocksOnly) judged = n == block && s_zero_token == 0;
    similar[out_row] = judged && sim > threshold ? 1 : 0;
  }
}

// One CTA per (q block r, head h, batch b): scores, softmax, ordering by (p desc, c asc) with a
// bitonic sort of 64-bit keys, the top-n / cdf cut, the fixed columns and always-keep blocks,
// then the row's kept ids in ascending order.
__global__ void select_rows_kernel(const TopkParams p, int sort_size) {
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned long long* keys = reinterpret_cast<unsigned long long*>(smem);  // sort_size
  float* prob = reinterpret_cast<float*>(keys + sort_size);                 // kv_blocks
  float* pq = prob + p.kv_blocks;                                           // dim
  uint8_t* keep = reinterpret_cast<uint8_t*>(pq + p.dim);                    // kv_blocks
  __shared__ float s_red[kRowThreads / 32];
  __shared__ int s_n;

  const int r = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (p.heads_q / p.heads_kv);
  const int kvb = p.kv_blocks;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  const int64_t row = (static_cast<int64_t>(b) * p.heads_q + h) * p.q_blocks + r;
  const int64_t k_rows = (static_cast<int64_t>(b) * p.heads_kv + hk) * kvb;
  const bool q_similar = p.similar_q[row] != 0;

  for (int d = tid; d < p.dim; d += blockDim.x) pq[d] = p.pooled_q[row * p.dim + d];
  for (int c = tid; c < kvb; c += blockDim.x) keep[c] = q_similar ? 0 : 1;
  __syncthreads();

  if (q_similar) {
    // Scores of the self-similar k blocks; the others are kept in every row (their whole column).
    for (int c = warp; c < kvb; c += warps) {
      const bool candidate = p.similar_k[k_rows + c] != 0;
      float dot = 0.f;
      if (candidate) {
        // Lane l adds dims l, l + 32, ... in that order (dim is a multiple of 32, at most 256). A
        // fixed unrolled loop lets every load of the dot issue before the first multiply waits;
        // the strided loop over p.dim was compiled into a chain that waited on each load in turn.
        const float* pk = p.pooled_k + (k_rows + c) * p.dim;
        const int per_lane = p.dim >> 5;
#pragma unroll
        for (int j = 0; j < kMaxDimPerLane; ++j)
          if (j < per_lane) dot += pq[lane + 32 * j] * pk[lane + 32 * j];
        dot = warp_sum(dot);
      }
      if (lane == 0) {
        prob[c] = candidate ? p.scale * dot : -INFINITY;
        if (!candidate) keep[c] = 1;
      }
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int c = tid; c < kvb; c += blockDim.x) mx = fmaxf(mx, prob[c]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) s_red[warp] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int w = 0; w < warps; ++w) mx = fmaxf(mx, s_red[w]);
    __syncthreads();
    float sum = 0.f;
    for (int c = tid; c < kvb; c += blockDim.x) {
      const float e = prob[c] == -INFINITY ? 0.f : expf(prob[c] - mx);
      prob[c] = e;
      sum += e;
    }
    sum = warp_sum(sum);
    if (lane == 0) s_red[warp] = sum;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < warps; ++w) total += s_red[w];
    int candidates = 0;
    for (int i = tid; i < sort_size; i += blockDim.x) {
      unsigned long long key = 0ull;
      if (i < kvb && p.similar_k[k_rows + i] != 0) {
        const float pr = prob[i] / total;
        prob[i] = pr;
        // p >= 0, so its bits order like the value; ties go to the lower block id.
        key = (static_cast<unsigned long long>(__float_as_uint(pr)) << 32) | (0xffffffffu - static_cast<unsigned>(i));
        ++candidates;
      }
      keys[i] = key;
    }
    int all_candidates = 0;
    block_exclusive_scan(candidates, &all_candidates);
    bitonic_sort_descending(keys, sort_size);
    __syncthreads();
    if (tid == 0) {
      int n = p.head_n_topk ? p.head_n_topk[h] : p.n_topk;
      if (p.cdf_threshold > 0.f) {
        const float cdf = p.head_cdf ? p.head_cdf[h] : p.cdf_threshold;
        float cumulative = 0.f;
        n = 0;
        while (n < all_candidates) {
          const int c = static_cast<int>(0xffffffffu - static_cast<unsigned>(keys[n] & 0xffffffffull));
          cumulative += prob[c];
          if (p.cdf_at_most && n > 0 && cumulative > cdf) break;
          ++n;
          if (!p.cdf_at_most && cumulative >= cdf) break;
        }
      }
      s_n = min(n, all_candidates);
    }
    __syncthreads();
    for (int i = tid; i < s_n; i += blockDim.x)
      keep[static_cast<int>(0xffffffffu - static_cast<unsigned>(keys[i] & 0xffffffffull))] = 1;
  }

  // Always-keep blocks: the diagonal (bottom-right aligned) and the first sink blocks.
  if (p.keep_diagonal) keep_diagonal_blocks(keep, r, p.seq_q, p.seq_kv, p.block_q, p.block_kv);
  for (int c = tid; c < min(p.sink_blocks, kvb); c += blockDim.x) keep[c] = 1;
  __syncthreads();

  // The row's ids in ascending order.
  write_kept_row(keep, kvb, p.row_blocks + row * kvb, p.row_counts + row);
}

// Launches the pooling instance for the rule's flags (smoothing when mean_of_head is given).
template <typename T>
void launch_pool_blocks(const T* x, int64_t stride_b, int64_t stride_s, int64_t stride_h, int seq, int block,
                        int blocks, int heads, int batch, int dim, float threshold, bool whole_blocks_only,
                        const float* mean_of_head, float* pooled, uint8_t* similar, cudaStream_t stream) {
  const auto launch = [&](auto kernel) {
    kernel<<<dim3(blocks, heads, batch), kPoolWarps * 32, 0, stream>>>(x, stride_b, stride_s, stride_h, seq, block,
                                                                       blocks, heads, dim, threshold, mean_of_head,
                                                                       pooled, similar);
  };
  if (mean_of_head)
    whole_blocks_only ? launch(pool_blocks_kernel<T, true, true>) : launch(pool_blocks_kernel<T, true, false>);
  else
    whole_blocks_only ? launch(pool_blocks_kernel<T, false, true>) : launch(pool_blocks_kernel<T, false, false>);
}

template <typename T>
void launch_pooling(const TopkParams& p, cudaStream_t stream) {
  launch_pool_blocks(static_cast<const T*>(p.q), p.q_stride_b, p.q_stride_s, p.q_stride_h, p.seq_q, p.block_q,
                     p.q_blocks, p.heads_q, p.batch, p.dim, p.similarity_threshold, p.whole_blocks_only, nullptr,
                     p.pooled_q, p.similar_q, stream);
  if (p.k_mean) {
    float* partial = p.k_mean + static_cast<int64_t>(p.batch) * p.heads_kv * p.dim;
    sequence_partial_sum_kernel<T><<<dim3(kTopkMeanChunks, p.heads_kv, p.batch), kMeanThreads, 0, stream>>>(
        static_cast<const T*>(p.k), p.k_stride_b, p.k_stride_s, p.k_stride_h, p.seq_kv, p.heads_kv, p.dim, partial);
    sequence_mean_kernel<<<dim3(p.heads_kv, p.batch), 128, 0, stream>>>(partial, p.seq_kv, p.heads_kv, p.dim, p.k_mean);
  }
  launch_pool_blocks(static_cast<const T*>(p.k), p.k_stride_b, p.k_stride_s, p.k_stride_h, p.seq_kv, p.block_kv,
                     p.kv_blocks, p.heads_kv, p.batch, p.dim, p.similarity_threshold, p.whole_blocks_only, p.k_mean,
                     p.pooled_k, p.similar_k, stream);
}

}  // namespace

void launch_topk_estimation(const TopkParams& p, DType dtype, cudaStream_t stream) {
  if (dtype == DType::kBF16)
    launch_pooling<__nv_bfloat16>(p, stream);
  else
    launch_pooling<__half>(p, stream);
  int sort_size = 1;
  while (sort_size < p.kv_blocks) sort_size <<= 1;
  const size_t smem = sort_size * sizeof(unsigned long long) + p.kv_blocks * sizeof(float) + p.dim * sizeof(float) +
                      p.kv_blocks;
  static const cudaError_t attribute_status = cudaFuncSetAttribute(
      select_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
      kTopkMaxKvBlocks * (sizeof(unsigned long long) + sizeof(float) + 1) + 256 * sizeof(float));
  (void)attribute_status;
  select_rows_kernel<<<dim3(p.q_blocks, p.heads_q, p.batch), kRowThreads, smem, stream>>>(p, sort_size);
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads_q * p.q_blocks;
  launch_rows_to_csr(p.row_blocks, p.row_counts, rows, p.kv_blocks, p.indptr, p.indices, stream);
}

}  // namespace tessel::cuda::detail
