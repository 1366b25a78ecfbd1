// merge_attention_states on the device: one warp per (batch, token, head) row of strided (B, S, H, D)
// views, four elements per lane when the rows are aligned for it. The warp reads
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

// Four consecutive elements (the caller guarantees their alignment): one 8- or 16-byte access
// instead of four, which is what keeps the merge at memory speed.
__device__ __forceinline__ float4 load4_as_float(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBF16: {
      const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(base) + i);
      const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
      const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
      return make_float4(lo.x, lo.y, hi.x, hi.y);
    }
    case DType::kF16: {
      const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const __half*>(base) + i);
      const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
      const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
      return make_float4(lo.x, lo.y, hi.x, hi.y);
    }
    default: return *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
  }
}

__device__ __forceinline__ void store4_from_float(void* base, DType dtype, int64_t i, float4 x) {
  switch (dtype) {
    case DType::kBF16: {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
      uint2 raw;
      raw.x = *reinterpret_cast<const uint32_t*>(&lo);
      raw.y = *reinterpret_cast<const uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(base) + i) = raw;
      break;
    }
    case DType::kF16: {
      const __half2 lo = __floats2half2_rn(x.x, x.y), hi = __floats2half2_rn(x.z, x.w);
      uint2 raw;
      raw.x = *reinterpret_cast<const uint32_t*>(&lo);
      raw.y = *reinterpret_cast<const uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(static_cast<__half*>(base) + i) = raw;
      break;
    }
    default: *reinterpret_cast<float4*>(static_cast<float*>(base) + i) = x; break;
  }
}

template <bool kVector4>
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
  if constexpr (kVector4) {
    for (int64_t d = 4 * lane; d < p.head_dim; d += 128) {
      const float4 a = wa == 0.f ? make_float4(0.f, 0.f, 0.f, 0.f) : load4_as_float(p.out_a, p.dtype_a, base_a + d);
      const float4 bv = wb == 0.f ? make_float4(0.f, 0.f, 0.f, 0.f) : load4_as_float(p.out_b, p.dtype_b, base_b + d);
      store4_from_float(p.out, p.dtype_out, base_out + d,
                        make_float4(wa * a.x + wb * bv.x, wa * a.y + wb * bv.y, wa * a.z + wb * bv.z, wa * a.w + wb * bv.w));
    }
  } else {
    for (int64_t d = lane; d < p.head_dim; d += 32) {
      const float a = wa == 0.f ? 0.f : wa * load_as_float(p.out_a, p.dtype_a, base_a + d);
      const float bv = wb == 0.f ? 0.f : wb * load_as_float(p.out_b, p.dtype_b, base_b + d);
      store_from_float(p.out, p.dtype_out, base_out + d, a + bv);
    }
  }
  if (p.lse != nullptr && lane == 0) p.lse[lse_index] = lse;
}

// Every row of every operand starts on a 4-element boundary that is 4-element aligned in memory.
bool vector4_aligned(const MergeParams& p) {
  if (p.head_dim % 4 != 0) return false;
  const auto aligned = [](const void* base, DType dtype, const int64_t* strides) {
    const uintptr_t bytes = static_cast<uintptr_t>(4 * dtype_size(dtype));
    return reinterpret_cast<uintptr_t>(base) % bytes == 0 && strides[0] % 4 == 0 && strides[1] % 4 == 0 &&
           strides[2] % 4 == 0;
  };
  return aligned(p.out_a, p.dtype_a, p.strides_a) && aligned(p.out_b, p.dtype_b, p.strides_b) &&
         aligned(p.out, p.dtype_out, p.strides_out);
}

}  // namespace

void launch_merge_attention_states(const MergeParams& params, cudaStream_t stream) {
  const int64_t rows = params.batch * params.seq * params.heads;
  if (rows == 0) return;
  constexpr int kWarps = 8;
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  if (vector4_aligned(params))
    merge_states_kernel<true><<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(params);
  else
    merge_states_kernel<false><<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(params);
}

}  // namespace tessel::cuda::detail
