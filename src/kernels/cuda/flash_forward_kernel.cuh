// FlashAttention-2 style forward kernel (mma.sync m16n8k16, fp32 accumulation), shared by the
// dense and the block-sparse entry points: both walk a list of 64-key tiles through the same
// inner loop; only the tile list differs (a contiguous range, or the mask row's kept blocks).
//
// Layout of one CTA (4 warps, 128 threads): BLOCK_M = 64 * MT query rows, each warp owns 16 * MT
// consecutive rows (MT m16 tiles) so that every K/V fragment read from shared memory feeds MT
// MMAs. Q stays in shared memory; K and V tiles of 64 rows are double-buffered with cp.async so
// the copy of tile j+1 overlaps the math of tile j. Shared tiles are XOR-swizzled in 16-byte
// chunks (chunk ^ (row & 7)) so ldmatrix and cp.async are free of bank conflicts.
// Softmax runs in the log2 domain: exp2(s * scale * log2(e) - m * scale * log2(e)), one FFMA and
// one MUFU per score; P goes from the S accumulators straight into A fragments (no shared memory).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/flash_params.h"

namespace tessel::cuda::detail {

template <typename T> struct MmaType;
template <> struct MmaType<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};
template <> struct MmaType<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

template <typename T>
__device__ __forceinline__ void mma_16816(float* c, const uint32_t* a, const uint32_t* b);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16-byte async copy; src_bytes = 0 writes zeros (rows past the end of the sequence).
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
}
// exp2 on the special-function unit (flushes denormal results to zero, harmless for softmax).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

// Byte offset of element (row, col) in a swizzled tile of D columns; col is a multiple of 8 or
// lies inside the chunk that starts at a multiple of 8.
template <int D>
__device__ __forceinline__ uint32_t swizzled(int row, int col) {
  const int chunk = (col >> 3) ^ (row & 7);
  return static_cast<uint32_t>((row * D + (chunk << 3) + (col & 7)) * 2);
}

// Copies ROWS rows of D elements from `gmem` (row 0 of the tile; row stride in elements) into a
// swizzled shared tile; rows at or past `rows_valid` are zero-filled. Each thread owns one
// 16-byte column chunk and every kRowsPerPass-th row, so the shared offset is one per-thread
// constant plus immediates and the global address advances by one add per row.
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(uint32_t smem_base, const uint16_t* gmem, int64_t row_stride, int rows_valid,
                                          int tid) {
  constexpr int kChunksPerRow = D / 8;
  constexpr int kRowsPerPass = THREADS / kChunksPerRow;
  static_assert(ROWS % kRowsPerPass == 0 && kRowsPerPass % 8 == 0, "tile rows must split evenly over the threads");
  const int r = tid / kChunksPerRow;
  const int c = (tid % kChunksPerRow) * 8;
  const uint32_t s = smem_base + swizzled<D>(r, c);
  const uint16_t* g = gmem + r * row_stride + c;
  const int64_t pass_stride = kRowsPerPass * row_stride;
  if (rows_valid >= ROWS) {
#pragma unroll
    for (int pass = 0; pass < ROWS / kRowsPerPass; ++pass)
      cp_async_16(s + pass * kRowsPerPass * D * 2, g + pass * pass_stride, 16);
  } else {
#pragma unroll
    for (int pass = 0; pass < ROWS / kRowsPerPass; ++pass) {
      const bool inside = r + pass * kRowsPerPass < rows_valid;
      cp_async_16(s + pass * kRowsPerPass * D * 2, inside ? g + pass * pass_stride : gmem, inside ? 16 : 0);
    }
  }
}

// Kept kv-block ids of a mask row are staged in shared memory (up to this many; the rest, for
// rows longer than any realistic sequence needs, are read from global memory).
inline constexpr int kIndexCache = 1024;

// The tile list of one CTA: dense walks tiles [first, first + count); sparse walks the mask
// row's kept blocks, each split into block_kv / 64 tiles, skipping tiles that lie wholly outside
// the visible key range [kv_lo, kv_hi] (this also makes out-of-range indices harmless).
template <bool kSparse>
struct TileWalk {
  int kv_lo, kv_hi;
  int first, count;             // dense
  const int32_t* row_indices;   // sparse: global
  int64_t row_begin;            // sparse: the row's first position in the mask's indices
  const int32_t* cached;        // sparse: the first cached_count ids, in shared memory
  int cached_count;
  int row_blocks, sub_shift, block_kv;

  __device__ __forceinline__ int tile_start(int t) const {
    if constexpr (kSparse) {
      const int i = t >> sub_shift;
      const int block = i < cached_count ? cached[i] : row_indices[i];
      return block * block_kv + ((t & ((1 << sub_shift) - 1)) << 6);
    } else {
      return (first + t) * 64;
    }
  }
  __device__ __forceinline__ int end() const { return kSparse ? row_blocks << sub_shift : count; }
  // First tile index >= t whose keys intersect [kv_lo, kv_hi], or end().
  __device__ __forceinline__ int next(int t) const {
    if constexpr (kSparse) {
      const int e = end();
      while (t < e) {
        const int s = tile_start(t);
        if (s <= kv_hi && s + 63 >= kv_lo) break;
        ++t;
      }
      return t;
    } else {
      return t;
    }
  }
};

// The walk of the CTA whose query rows are [m0, row_last]: the union of their visible keys
// [kv_lo, kv_hi] and, for a block mask, the row of (batch, head, m0's query block). A sparse walk
// still needs `cached` and `cached_count` set to the ids its CTA staged.
template <bool kSparse>
__device__ __forceinline__ TileWalk<kSparse> make_tile_walk(const FlashParams& p, int batch, int head, int m0,
                                                            int row_last) {
  TileWalk<kSparse> walk;
  walk.kv_lo = p.has_lo ? max(0, m0 + p.lo_offset) : 0;
  walk.kv_hi = p.has_hi ? min(p.seq_kv - 1, row_last + p.hi_offset) : p.seq_kv - 1;
  if constexpr (kSparse) {
    const int mask_b = p.mask_batch == 1 ? 0 : batch;
    const int mask_h = p.mask_heads == 1 ? 0 : head / p.mask_head_div;
    const int row = (mask_b * p.mask_heads + mask_h) * p.q_blocks + m0 / p.block_q;
    const int begin = p.indptr[row];
    walk.row_begin = begin;
    walk.row_indices = p.indices + begin;
    walk.row_blocks = p.indptr[row + 1] - begin;
    walk.sub_shift = p.sub_shift;
    walk.block_kv = p.block_kv;
  } else {
    walk.first = walk.kv_lo / 64;
    walk.count = walk.kv_hi >= walk.kv_lo ? walk.kv_hi / 64 - walk.first + 1 : 0;
  }
  return walk;
}

template <typename T, int D, int MT, bool kSparse>
__global__ void __launch_bounds__(128, 2) flash_forward_kernel(const FlashParams p) {
  constexpr int kThreads = 128;
  constexpr int kBlockM = 64 * MT;
  constexpr int kBlockN = 64;
  constexpr int kNTiles = kBlockN / 8;  // S n8 tiles per row slab
  constexpr int kDTiles = D / 8;        // O n8 tiles per row slab

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t s_k = s_q + kBlockM * D * 2;
  const uint32_t s_v = s_k + 2 * kBlockN * D * 2;
  constexpr uint32_t kStageBytes = kBlockN * D * 2;

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // causal: the longest rows start first
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int kv_head = head / p.group;
  const int m0 = m_block * kBlockM;
  const int row_last = min(m0 + kBlockM, p.seq_q) - 1;

  const uint16_t* q = static_cast<const uint16_t*>(p.q) + batch * p.q_stride_b + head * p.q_stride_h;
  const uint16_t* k = static_cast<const uint16_t*>(p.k) + batch * p.k_stride_b + kv_head * p.k_stride_h;
  const uint16_t* v = static_cast<const uint16_t*>(p.v) + batch * p.v_stride_b + kv_head * p.v_stride_h;

  TileWalk<kSparse> walk = make_tile_walk<kSparse>(p, batch, head, m0, row_last);
  if constexpr (kSparse) {
    int32_t* cache = reinterpret_cast<int32_t*>(smem + (kBlockM * D + 4 * kBlockN * D) * 2);
    walk.cached_count = min(walk.row_blocks, kIndexCache);
    for (int i = tid; i < walk.cached_count; i += kThreads) cache[i] = walk.row_indices[i];
    walk.cached = cache;
    __syncthreads();
  }
  // Rows that need no per-element mask: every key in [lo(row_last), hi(m0)] is visible to all rows.
  const int all_rows_lo = p.has_lo ? m0 + p.lo_offset + (row_last - m0) : -kNoLimit;
  const int all_rows_hi = p.has_hi ? min(p.seq_kv - 1, m0 + p.hi_offset) : p.seq_kv - 1;

  load_tile<D, kBlockM, kThreads>(s_q, q + static_cast<int64_t>(m0) * p.q_stride_s, p.q_stride_s, p.seq_q - m0, tid);
  int tile = walk.next(0);
  if (tile < walk.end()) {
    const int n0 = walk.tile_start(tile);
    load_tile<D, kBlockN, kThreads>(s_k, k + static_cast<int64_t>(n0) * p.k_stride_s, p.k_stride_s, p.seq_kv - n0, tid);
    load_tile<D, kBlockN, kThreads>(s_v, v + static_cast<int64_t>(n0) * p.v_stride_s, p.v_stride_s, p.seq_kv - n0, tid);
  }
  cp_async_commit();

  float o_acc[MT][kDTiles][4];
  float row_max[MT][2];
  float row_sum[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[mt][dt][e] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }

  const int warp_row0 = warp * 16 * MT;
  const int group = lane >> 2;
  const int quad = lane & 3;
  // ldmatrix lane addressing (see the fragment layouts of mma.m16n8k16).
  // ldmatrix lane addresses. A lane reads row r, 16-byte chunk c = 2*step + c0 of a tile, stored
  // at chunk c ^ (r & 7). For step = 4*a + b that is 8*a + ((2*b + c0) ^ (r & 7)): four per-lane
  // offsets (b = 0..3) plus compile-time constants, so the unrolled loops address with immediates.
  const int a_row = lane & 15, a_c0 = lane >> 4;                                // Q (A operand)
  const int kb_row = (lane & 7) + ((lane >> 4) << 3), kb_c0 = (lane >> 3) & 1;  // K (B, two n8 tiles)
  const int vb_row = (lane & 7) + (((lane >> 3) & 1) << 3), vb_c0 = lane >> 4;  // V (B^T, two n8 tiles)
  uint32_t q_addr[4], k_off[4], v_off[4];
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    q_addr[b] = s_q + (warp_row0 + a_row) * D * 2 + ((((2 * b) + a_c0) ^ (a_row & 7)) << 4);
    k_off[b] = kb_row * D * 2 + ((((2 * b) + kb_c0) ^ (kb_row & 7)) << 4);
    v_off[b] = vb_row * D * 2 + ((((2 * b) + vb_c0) ^ (vb_row & 7)) << 4);
  }

  cp_async_wait_all();
  __syncthreads();

  int stage = 0;
  while (tile < walk.end()) {
    const int n0 = walk.tile_start(tile);
    const int next_tile = walk.next(tile + 1);
    if (next_tile < walk.end()) {
      const int n1 = walk.tile_start(next_tile);
      const uint32_t off = (stage ^ 1) * kStageBytes;
      load_tile<D, kBlockN, kThreads>(s_k + off, k + static_cast<int64_t>(n1) * p.k_stride_s, p.k_stride_s,
                                      p.seq_kv - n1, tid);
      load_tile<D, kBlockN, kThreads>(s_v + off, v + static_cast<int64_t>(n1) * p.v_stride_s, p.v_stride_s,
                                      p.seq_kv - n1, tid);
    }
    cp_async_commit();

    const uint32_t sk = s_k + stage * kStageBytes;
    const uint32_t sv = s_v + stage * kStageBytes;

    // S = Q K^T for this warp's 16*MT rows and 64 keys.
    float s_acc[MT][kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s_acc[mt][nt][e] = 0.f;

#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldmatrix_x4(a[mt], q_addr[kk & 3] + mt * 16 * D * 2 + (kk >> 2) * 128);
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, sk + k_off[kk & 3] + np * 16 * D * 2 + (kk >> 2) * 128);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(s_acc[mt][2 * np], a[mt], b);
          mma_16816<T>(s_acc[mt][2 * np + 1], a[mt], b + 2);
        }
      }
    }

    // Per-element limits only where the tile crosses the sequence end or a causal/window edge.
    const bool needs_mask = n0 + kBlockN - 1 > all_rows_hi || n0 < all_rows_lo;
    if (needs_mask) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = m0 + warp_row0 + mt * 16 + group + half * 8;
          const int hi = p.has_hi ? min(p.seq_kv - 1, i + p.hi_offset) : p.seq_kv - 1;
          const int lo = p.has_lo ? i + p.lo_offset : -kNoLimit;
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int j = n0 + nt * 8 + quad * 2 + e;
              if (j > hi || j < lo) s_acc[mt][nt][half * 2 + e] = -INFINITY;
            }
        }
    }

    // Sub-block masks: each thread reads the two words (64 keys) of this tile for each of its rows.
    // Rows past seq_q read bits of their q block that exist and are never stored.
    if constexpr (kSparse) {
      if (p.sub_block_bits != nullptr) {
        const int64_t position = walk.row_begin + (tile >> walk.sub_shift);
        const int word0 = (tile & ((1 << walk.sub_shift) - 1)) * 2;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int r = (m0 + warp_row0 + mt * 16 + group + half * 8) % p.block_q;
            const uint32_t* words = p.sub_block_bits + (position * p.block_q + r) * p.sub_block_words + word0;
            const uint32_t low = words[0], high = words[1];
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int c = nt * 8 + quad * 2 + e;
                const uint32_t bit = ((c < 32 ? low : high) >> (c & 31)) & 1u;
                if (bit == 0) s_acc[mt][nt][half * 2 + e] = -INFINITY;
              }
          }
      }
    }

    // Online softmax: new row max, rescale O and the running sums, P = exp2(S*c - m*c).
    uint32_t p_frag[MT][kNTiles / 2][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float mx = row_max[mt][half];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
          mx = fmaxf(mx, fmaxf(s_acc[mt][nt][half * 2], s_acc[mt][nt][half * 2 + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float shift = mx == -INFINITY ? 0.f : mx * p.scale_log2;
        const float alpha = mx == row_max[mt][half] ? 1.f : fast_exp2(row_max[mt][half] * p.scale_log2 - shift);
        row_max[mt][half] = mx;
        row_sum[mt][half] *= alpha;
        // Once the running max settles (most tiles of a long row), the warp skips the rescale.
        if (__any_sync(0xffffffffu, alpha != 1.f)) {
#pragma unroll
          for (int dt = 0; dt < kDTiles; ++dt) {
            o_acc[mt][dt][half * 2] *= alpha;
            o_acc[mt][dt][half * 2 + 1] *= alpha;
          }
        }
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          const float p0 = fast_exp2(s_acc[mt][nt][half * 2] * p.scale_log2 - shift);
          const float p1 = fast_exp2(s_acc[mt][nt][half * 2 + 1] * p.scale_log2 - shift);
          s_acc[mt][nt][half * 2] = p0;
          s_acc[mt][nt][half * 2 + 1] = p1;
          sum += p0 + p1;
        }
        row_sum[mt][half] += sum;
      }
      // The C layout of two adjacent n8 tiles is the A layout of one k16 step.
#pragma unroll
      for (int kk = 0; kk < kNTiles / 2; ++kk) {
        p_frag[mt][kk][0] = MmaType<T>::pack(s_acc[mt][2 * kk][0], s_acc[mt][2 * kk][1]);
        p_frag[mt][kk][1] = MmaType<T>::pack(s_acc[mt][2 * kk][2], s_acc[mt][2 * kk][3]);
        p_frag[mt][kk][2] = MmaType<T>::pack(s_acc[mt][2 * kk + 1][0], s_acc[mt][2 * kk + 1][1]);
        p_frag[mt][kk][3] = MmaType<T>::pack(s_acc[mt][2 * kk + 1][2], s_acc[mt][2 * kk + 1][3]);
      }
    }

    // O += P V.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, sv + v_off[dp & 3] + kk * 16 * D * 2 + (dp >> 2) * 128);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(o_acc[mt][2 * dp], p_frag[mt][kk], b);
          mma_16816<T>(o_acc[mt][2 * dp + 1], p_frag[mt][kk], b + 2);
        }
      }
    }

    cp_async_wait_all();
    __syncthreads();
    stage ^= 1;
    tile = next_tile;
  }

  // Epilogue: finish the row sums, write LSE, stage O (normalized, in T) through this warp's own
  // Q rows in shared memory and store it with 16-byte coalesced writes.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = row_sum[mt][half];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      const int r = warp_row0 + mt * 16 + group + half * 8;
      const int i = m0 + r;
      if (p.lse != nullptr && quad == 0 && i < p.seq_q) {
        const float lse = sum > 0.f ? (row_max[mt][half] * p.scale_log2 + __log2f(sum)) * 0.69314718055994531f
                                    : -INFINITY;
        p.lse[(static_cast<int64_t>(batch) * p.heads_q + head) * p.seq_q + i] = lse;
      }
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const uint32_t packed = MmaType<T>::pack(o_acc[mt][dt][half * 2] * inv, o_acc[mt][dt][half * 2 + 1] * inv);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(s_q + swizzled<D>(r, dt * 8 + quad * 2)), "r"(packed));
      }
    }
  __syncwarp();

  uint16_t* out = static_cast<uint16_t*>(p.out) + batch * p.o_stride_b + head * p.o_stride_h;
  constexpr int kChunksPerRow = D / 8;
  constexpr int kWarpChunks = 16 * MT * kChunksPerRow;
#pragma unroll
  for (int idx = lane; idx < kWarpChunks; idx += 32) {
    const int r = warp_row0 + idx / kChunksPerRow;
    const int c = (idx % kChunksPerRow) * 8;
    if (m0 + r < p.seq_q) {
      uint4 val;
      asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                   : "r"(s_q + swizzled<D>(r, c)));
      *reinterpret_cast<uint4*>(out + static_cast<int64_t>(m0 + r) * p.o_stride_s + c) = val;
    }
  }
}

template <int D, int MT, bool kSparse>
constexpr int flash_forward_smem_bytes() {
  return (64 * MT * D + 2 * 2 * 64 * D) * 2 + (kSparse ? kIndexCache * 4 : 0);
}

}  // namespace tessel::cuda::detail
