// merge_attention_states on the device: one warp per (batch, token, head) row of strided (B, S, H, D)
// views. The warp reads
// both LSEs before any lane writes, so out/lse may alias either input.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/merge_states.h"

namespace tessel::cuda::detail {

namespace {

__device__ __forceinline__ float load_as_float(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::kF16: return __half2float(static_cast<const __half*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ void store_from_float(void* base, DType dtype, int64_t i, float x) {
  switch (dtype) {
    case DType::kBF16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x); break;
    case DType::kF16: static_cast<__half*>(base)[i] = __float2half_rn(x); break;
    default: static_cast<float*>(base)[i] = x; break;
  }
}

__global__ void merge_states_kernel(const MergeParams p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  const int64_t rows = p.batch * p.seq * p.heads;
  if (row >= rows) return;
  // row enumerates (b, s, h) in BSHD order; the LSE is (B, H, S).
  const int64_t h = row % p.heads;
  const int64_t s = (row / p.heads) % p.seq;
  const int64_t b = row / (p.heads * p.seq);
  const int64_t lse_index = (b * p.heads + h) * p.seq + s;
  const float la = p.lse_a[lse_index];
  const float lb = p.lse_b[lse_index];
  const float m = fmaxf(la, lb);
  float wa = 0.f, wb = 0.f, lse = -INFINITY;
  if (m != -INFINITY) {
    wa = __expf(la - m);
    wb = __expf(lb - m);
    const float total = wa + wb;
    lse = m + __logf(total);
    wa /= total;
    wb /= total;
  }
  __syncwarp();
  const int64_t base_a = b * p.strides_a[0] + s * p.strides_a[1] + h * p.strides_a[2];
  const int64_t base_b = b * p.strides_b[0] + s * p.strides_b[1] + h * p.strides_b[2];
  const int64_t base_out = b * p.strides_out[0] + s * p.strides_out[1] + h * p.strides_out[2];
  for (int64_t d = lane; d < p.head_dim; d += 32) {
    const float a = wa == 0.f ? 0.f : wa * load_as_float(p.out_a, p.dtype_a, base_a + d);
    const float bv = wb == 0.f ? 0.f : wb * load_as_float(p.out_b, p.dtype_b, base_b + d);
    store_from_float(p.out, p.dtype_out, base_out + d, a + bv);
  }
  if (p.lse != nullptr && lane == 0) p.lse[lse_index] = lse;
}

}  // namespace

void launch_merge_attention_states(const MergeParams& params, cudaStream_t stream) {
  const int64_t rows = params.batch * params.seq * params.heads;
  if (rows == 0) return;
  constexpr int kWarps = 8;
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  merge_states_kernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(params);
}

}  // namespace tessel::cuda::detail
