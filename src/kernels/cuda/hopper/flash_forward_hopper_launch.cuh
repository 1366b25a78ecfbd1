// The launch of flash_forward_hopper_kernel for one element type and head dim, instantiated by
// flash_forward_hopper_d*.cu (one file per head dim, so the instantiations compile in parallel).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cuda/hopper/device_support.h"
#include "cuda/hopper/flash_forward_hopper_kernel.cuh"
#include "cuda/hopper/flash_forward_hopper_launch.h"
#include "cuda/hopper/work_order.h"
#include "tessel/core/error.h"

namespace tessel::cuda::detail {

// kFp8: the maps read the e4m3 operands of `fp8` (quantized before, in stream order) and the
// kernel their scales (and, quantized with K smoothing, the LSE shifts); otherwise q, k, v of `p`
// directly. kTmaStore: the kernel stores O through a map of `out` too; make_params' checks of out
// (16-byte aligned base and strides, D contiguous) are what a map needs, so every out it accepts
// has one.
template <typename T, int D, bool kSparse, bool kFp8 = false, bool kNarrow = false, bool kPingPong = false,
          bool kPolyExp2 = false, bool kLazyRescale = false, bool kTmaStore = false, bool kOverlapEpilogue = false>
void launch_hopper_kernel(const FlashParams& p, int batch, int heads_kv, DType dtype, const WorkOrder& order,
                          cudaStream_t stream, const Fp8Operands* fp8 = nullptr, bool fp8_smooth_k = false) {
  constexpr int kPaddedD = (D + 63) / 64 * 64;
  constexpr int kSmem =
      static_cast<int>(hopper::HopperConfig<kPaddedD, kFp8, kNarrow>::bytes(kSparse) + hopper::kAlignmentSlack);
  static_assert(kSmem <= static_cast<int>(hopper::kMaxSharedBytes));
  auto kernel = flash_forward_hopper_kernel<T, D, kSparse, kFp8, kNarrow, kPingPong, kPolyExp2, kLazyRescale, kTmaStore,
                                            kOverlapEpilogue>;
  // Above 48 KB a kernel must opt in; done once per instantiation (cheap and graph-safe after).
  static const cudaError_t attribute_status =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  (void)attribute_status;
  FlashParams params = p;
  CUtensorMap q_map, k_map, v_map, o_map{};
  if constexpr (kTmaStore)
    o_map = make_bshd_map(p.out, dtype, D, p.seq_q, p.heads_q, batch, p.o_stride_s, p.o_stride_h, p.o_stride_b);
  if constexpr (kFp8) {
    q_map = make_fp8_token_map(fp8->q, D, p.seq_q, p.heads_q, batch);
    k_map = make_fp8_token_map(fp8->k, D, p.seq_kv, heads_kv, batch);
    v_map = make_fp8_transposed_map(fp8->vt, D, fp8->seq_kv_padded, heads_kv, batch);
    params.fp8_q_scale = fp8->q_scale;
    params.fp8_k_scale = fp8->k_scale;
    params.fp8_v_absmax = fp8->v_absmax;
  } else {
    q_map = make_bshd_map(p.q, dtype, D, p.seq_q, p.heads_q, batch, p.q_stride_s, p.q_stride_h, p.q_stride_b);
    k_map = make_bshd_map(p.k, dtype, D, p.seq_kv, heads_kv, batch, p.k_stride_s, p.k_stride_h, p.k_stride_b);
    v_map = make_bshd_map(p.v, dtype, D, p.seq_kv, heads_kv, batch, p.v_stride_s, p.v_stride_h, p.v_stride_b);
  }
  // Persistent: one CTA per multiprocessor (the shared memory allows no second), each walking
  // items until all are done; sm_margin of them left free for a concurrent kernel.
  const int64_t items = work_item_count(p.seq_q, p.heads_q, batch);
  if (items > std::numeric_limits<int>::max())
    throw Error(tessel::detail::concat("Hopper attention kernel: ", items,
                                       " work items (query blocks x heads x batch), more than 2^31 - 1"));
  const int multiprocessors = std::max(1, current_hopper_device().multiprocessors - p.sm_margin);
  const int grid = static_cast<int>(std::min<int64_t>(items, multiprocessors));
  // Block masks keep different numbers of blocks per row: hand the rows out longest first.
  const WorkOrder used = kSparse ? order : WorkOrder{};
  if (used.enabled()) launch_longest_first_order(p, batch, used, stream);
  const float* lse_shift = kFp8 && fp8_smooth_k ? fp8->lse_shift : nullptr;
  kernel<<<grid, hopper::kThreads, kSmem, stream>>>(q_map, k_map, v_map, o_map, params, batch, used, lse_shift);
}

// Defined and instantiated in flash_forward_hopper_d{64,128}_narrow.cu (TESSEL_INSTANTIATE_HOPPER_NARROW).
template <typename T, int D, bool kPingPong>
void launch_flash_forward_hopper_narrow(const FlashParams& params, bool sparse, int batch, int heads_kv, DType dtype,
                                        const WorkOrder& order, cudaStream_t stream);
// Defined and instantiated in flash_forward_hopper_d{64,128}_tma_store.cu (TESSEL_INSTANTIATE_HOPPER_TMA_STORE)
// and, with the next item's first QK^T before the epilogue, flash_forward_hopper_d{64,128}_overlap.cu
// (TESSEL_INSTANTIATE_HOPPER_OVERLAP).
template <typename T, int D, bool kPingPong>
void launch_flash_forward_hopper_tma_store(const FlashParams& params, bool sparse, int batch, int heads_kv, DType dtype,
                                           const WorkOrder& order, cudaStream_t stream);
template <typename T, int D, bool kPingPong>
void launch_flash_forward_hopper_overlap(const FlashParams& params, bool sparse, int batch, int heads_kv, DType dtype,
                                         const WorkOrder& order, cudaStream_t stream);

template <typename T, int D, bool kNarrow, bool kPingPong, bool kLazyRescale = false, bool kTmaStore = false,
          bool kOverlapEpilogue = false>
void launch_hopper_variant(const FlashParams& params, bool sparse, int batch, int heads_kv, DType dtype,
                           const WorkOrder& order, cudaStream_t stream) {
  sparse ? launch_hopper_kernel<T, D, true, false, kNarrow, kPingPong, false, kLazyRescale, kTmaStore, kOverlapEpilogue>(
               params, batch, heads_kv, dtype, order, stream)
         : launch_hopper_kernel<T, D, false, false, kNarrow, kPingPong, false, kLazyRescale, kTmaStore, kOverlapEpilogue>(
               params, batch, heads_kv, dtype, order, stream);
}

// Head dims 64 and 128 have every variant (kernel_variant.h), each in its own file so that they
// compile in parallel; the others have the default only.
template <typename T, int D>
void launch_flash_forward_hopper_typed(const FlashParams& params, bool sparse, int batch, int heads_kv, DType dtype,
                                       const WorkOrder& order, const HopperVariant& variant, cudaStream_t stream) {
  if constexpr (D == 64 || D == 128) {
    if (variant.narrow)
      return variant.ping_pong
                 ? launch_flash_forward_hopper_narrow<T, D, true>(params, sparse, batch, heads_kv, dtype, order, stream)
                 : launch_flash_forward_hopper_narrow<T, D, false>(params, sparse, batch, heads_kv, dtype, order, stream);
    if (variant.overlap_epilogue)
      return variant.ping_pong
                 ? launch_flash_forward_hopper_overlap<T, D, true>(params, sparse, batch, heads_kv, dtype, order, stream)
                 : launch_flash_forward_hopper_overlap<T, D, false>(params, sparse, batch, heads_kv, dtype, order, stream);
    if (variant.tma_store)
      return variant.ping_pong
                 ? launch_flash_forward_hopper_tma_store<T, D, true>(params, sparse, batch, heads_kv, dtype, order, stream)
                 : launch_flash_forward_hopper_tma_store<T, D, false>(params, sparse, batch, heads_kv, dtype, order, stream);
    if (variant.lazy_rescale)
      return variant.ping_pong
                 ? launch_hopper_variant<T, D, false, true, true>(params, sparse, batch, heads_kv, dtype, order, stream)
                 : launch_hopper_variant<T, D, false, false, true>(params, sparse, batch, heads_kv, dtype, order, stream);
    if (variant.ping_pong)
      return launch_hopper_variant<T, D, false, true>(params, sparse, batch, heads_kv, dtype, order, stream);
  }
  launch_hopper_variant<T, D, false, false>(params, sparse, batch, heads_kv, dtype, order, stream);
}

// The FP8 mode's kernel (head dim 128) for output type T and one combination of the kernel's FP8
// variant choices (kernel_variant.h); TESSEL_INSTANTIATE_HOPPER_FP8 instantiates each combination
// in one of flash_forward_hopper_fp8*.cu, so that they compile in parallel.
template <typename T, bool kPolyExp2, bool kLazyRescale, bool kPingPong>
void launch_hopper_fp8_kernel(const FlashParams& params, bool sparse, int batch, int heads_kv, const WorkOrder& order,
                              const Fp8Operands& operands, bool smooth_k, cudaStream_t stream) {
  const DType dtype = std::is_same_v<T, __nv_bfloat16> ? DType::kBF16 : DType::kF16;
  sparse ? launch_hopper_kernel<T, 128, true, true, false, kPingPong, kPolyExp2, kLazyRescale>(
               params, batch, heads_kv, dtype, order, stream, &operands, smooth_k)
         : launch_hopper_kernel<T, 128, false, true, false, kPingPong, kPolyExp2, kLazyRescale>(
               params, batch, heads_kv, dtype, order, stream, &operands, smooth_k);
}

}  // namespace tessel::cuda::detail

// The instantiations of one FP8 kernel combination (both output types), inside the namespace;
// EXTERN `extern` declares them (the dispatch in flash_forward_hopper_fp8.cu), empty defines them.
#define TESSEL_INSTANTIATE_HOPPER_FP8(EXTERN, POLY, LAZY, PING_PONG)                                                   \
  EXTERN template void launch_hopper_fp8_kernel<__nv_bfloat16, POLY, LAZY, PING_PONG>(                                 \
      const FlashParams&, bool, int, int, const WorkOrder&, const Fp8Operands&, bool, cudaStream_t);                    \
  EXTERN template void launch_hopper_fp8_kernel<__half, POLY, LAZY, PING_PONG>(const FlashParams&, bool, int, int,      \
                                                                              const WorkOrder&, const Fp8Operands&,   \
                                                                              bool, cudaStream_t)

// The explicit instantiations of one head dim's file (both element types).
#define TESSEL_INSTANTIATE_HOPPER_LAUNCH(D)                                                                     \
  template void tessel::cuda::detail::launch_flash_forward_hopper_typed<__nv_bfloat16, D>(                     \
      const FlashParams&, bool, int, int, DType, const WorkOrder&, const HopperVariant&, cudaStream_t);          \
  template void tessel::cuda::detail::launch_flash_forward_hopper_typed<__half, D>(                            \
      const FlashParams&, bool, int, int, DType, const WorkOrder&, const HopperVariant&, cudaStream_t)

// A variant family of one head dim in its own file (inside the namespace): the definition of
// LAUNCHER (with and without ping-pong) as launch_hopper_variant with the family's NARROW,
// TMA_STORE and OVERLAP choices, and its instantiations for both element types.
#define TESSEL_INSTANTIATE_HOPPER_FAMILY(LAUNCHER, D, NARROW, TMA_STORE, OVERLAP)                                     \
  template <typename T, int kD, bool kPingPong>                                                                      \
  void LAUNCHER(const FlashParams& params, bool sparse, int batch, int heads_kv, DType dtype, const WorkOrder& order,  \
                cudaStream_t stream) {                                                                               \
    launch_hopper_variant<T, kD, NARROW, kPingPong, false, TMA_STORE, OVERLAP>(params, sparse, batch, heads_kv, dtype, \
                                                                               order, stream);                       \
  }                                                                                                                  \
  template void LAUNCHER<__nv_bfloat16, D, false>(const FlashParams&, bool, int, int, DType, const WorkOrder&,         \
                                                  cudaStream_t);                                                     \
  template void LAUNCHER<__nv_bfloat16, D, true>(const FlashParams&, bool, int, int, DType, const WorkOrder&,          \
                                                 cudaStream_t);                                                      \
  template void LAUNCHER<__half, D, false>(const FlashParams&, bool, int, int, DType, const WorkOrder&, cudaStream_t); \
  template void LAUNCHER<__half, D, true>(const FlashParams&, bool, int, int, DType, const WorkOrder&, cudaStream_t)

// The narrow-stage variants of one head dim (flash_forward_hopper_d*_narrow.cu).
#define TESSEL_INSTANTIATE_HOPPER_NARROW(D) \
  TESSEL_INSTANTIATE_HOPPER_FAMILY(launch_flash_forward_hopper_narrow, D, true, false, false)
// The variants storing O through shared memory (flash_forward_hopper_d*_tma_store.cu).
#define TESSEL_INSTANTIATE_HOPPER_TMA_STORE(D) \
  TESSEL_INSTANTIATE_HOPPER_FAMILY(launch_flash_forward_hopper_tma_store, D, false, true, false)
// The same with the next item's first QK^T issued before the epilogue (flash_forward_hopper_d*_overlap.cu).
#define TESSEL_INSTANTIATE_HOPPER_OVERLAP(D) \
  TESSEL_INSTANTIATE_HOPPER_FAMILY(launch_flash_forward_hopper_overlap, D, false, true, true)
