// Shared-memory barriers (mbarrier) and the bulk tensor copy engine (TMA), sm_90: the pieces a
// producer warp needs to fill a ring of shared-memory stages that consumer warpgroups drain.
//
// A stage's "full" barrier completes when the producer has arrived and every byte it announced
// (expect_tx) has landed; its "empty" barrier completes when every consumer thread has arrived.
// Waiters pass the parity of the phase they wait for: a fresh barrier is in phase 0, so waiting
// for parity 1 returns at once (the producer's first pass over the ring).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace tessel::cuda::detail {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// Makes the barriers' initialization visible to the copy engine (the async proxy) and to the
// other threads; one thread runs it after the inits, then the CTA synchronizes.
__device__ __forceinline__ void mbarrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives and announces `bytes` that copies completing on this barrier will deliver.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred ready;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 ready, [%1], %2;\n"
        "selp.u32 %0, 1, 0, ready;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// Copies the box at coordinates (c0, c1, c2, c3) of a rank-4 tensor map into shared memory at
// `dst`, completing `bytes of the box` on barrier `bar`. Elements outside the tensor read as zero.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// Brings the box at (c0, c1, c2, c3) into L2 without waiting for it (a later copy of it hits L2).
__device__ __forceinline__ void tma_prefetch_l2_4d(const CUtensorMap* map, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global [%0, {%1, %2, %3, %4}];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

// Copies `src` (shared memory, laid out as the map's box with its swizzle) to the box at (c0, c1,
// c2, c3) of a rank-4 tensor map; elements outside the tensor are not written. Completes in the
// issuing thread's bulk async-group (bulk_commit_group, then bulk_wait_group_read before `src`
// is written again). Generic-proxy writes of `src` need fence_proxy_async_shared first.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until the thread's committed bulk stores have read their shared-memory sources (the
// writes to global memory may still be in flight).
__device__ __forceinline__ void bulk_wait_group_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// Waits until the thread's committed bulk stores are complete.
__device__ __forceinline__ void bulk_wait_group() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

#endif  // __CUDA_ARCH__ >= 900

}  // namespace tessel::cuda::detail
