// Host side of the warp-specialized Hopper forward kernel: the tensor maps the copy engine reads
// Q, K and V (or their FP8 copies) through, and the dispatch to the per-head-dim launchers
// (flash_forward_hopper_d*.cu, flash_forward_hopper_fp8.cu).
#include "cuda/hopper/flash_forward_hopper.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/hopper/device_support.h"
#include "cuda/hopper/flash_forward_hopper_launch.h"
#include "tessel/core/error.h"

namespace tessel::cuda::detail {

namespace {

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static std::once_flag once;
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  std::call_once(once, [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  });
  if (encode == nullptr) throw Error("Hopper attention kernel: the driver offers no cuTensorMapEncodeTiled");
  return encode;
}

// A rank-4 tensor map: dims innermost first, byte strides of dims 1..3, the box, the swizzle.
CUtensorMap encode_map(const void* data, CUtensorMapDataType type, const cuuint64_t (&dims)[4],
                       const cuuint64_t (&strides)[3], const cuuint32_t (&box)[4], CUtensorMapSwizzle swizzle) {
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult status =
      tensor_map_encoder()(&map, type, 4, const_cast<void*>(data), dims, strides, box, element_strides,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS)
    throw Error(tessel::detail::concat("Hopper attention kernel: cuTensorMapEncodeTiled failed with status ",
                                      static_cast<int>(status)));
  return map;
}

}  // namespace

// Boxes of 64 head-dim columns x 64 tokens. Strides of axes of size 1 are never stepped: any legal
// value stands in for them.
CUtensorMap make_bshd_map(const void* data, DType dtype, int head_dim, int seq, int heads, int batch, int64_t stride_s,
                          int64_t stride_h, int64_t stride_b) {
  auto bytes = [](int64_t stride, int size) { return static_cast<cuuint64_t>(size > 1 ? stride * 2 : 16); };
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(seq),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {bytes(stride_s, seq), bytes(stride_h, heads), bytes(stride_b, batch)};
  const cuuint32_t box[4] = {64, 64, 1, 1};
  return encode_map(data, dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                    dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

CUtensorMap make_fp8_token_map(const uint8_t* data, int head_dim, int seq, int heads, int batch) {
  const auto d = static_cast<cuuint64_t>(head_dim), s = static_cast<cuuint64_t>(seq), h = static_cast<cuuint64_t>(heads);
  const cuuint64_t dims[4] = {d, s, h, static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {h * d, d, s * h * d};
  const cuuint32_t box[4] = {128, 64, 1, 1};
  return encode_map(data, CU_TENSOR_MAP_DATA_TYPE_UINT8, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

CUtensorMap make_fp8_transposed_map(const uint8_t* data, int head_dim, int seq_padded, int heads, int batch) {
  const auto d = static_cast<cuuint64_t>(head_dim), s = static_cast<cuuint64_t>(seq_padded);
  const auto h = static_cast<cuuint64_t>(heads);
  const cuuint64_t dims[4] = {s, d, h, static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {s, d * s, h * d * s};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(head_dim), 1, 1};
  return encode_map(data, CU_TENSOR_MAP_DATA_TYPE_UINT8, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_64B);
}

namespace {

template <typename T>
void launch_for_head_dim(const FlashParams& params, int head_dim, bool sparse, int batch, int heads_kv, DType dtype,
                         const WorkOrder& order, const HopperVariant& v, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return launch_flash_forward_hopper_typed<T, 64>(params, sparse, batch, heads_kv, dtype, order, v, stream);
    case 96: return launch_flash_forward_hopper_typed<T, 96>(params, sparse, batch, heads_kv, dtype, order, v, stream);
    case 128: return launch_flash_forward_hopper_typed<T, 128>(params, sparse, batch, heads_kv, dtype, order, v, stream);
    case 192: return launch_flash_forward_hopper_typed<T, 192>(params, sparse, batch, heads_kv, dtype, order, v, stream);
    case 256: return launch_flash_forward_hopper_typed<T, 256>(params, sparse, batch, heads_kv, dtype, order, v, stream);
    default: throw Error(tessel::detail::concat("Hopper attention kernel: head dim ", head_dim, " has no instantiation"));
  }
}

}  // namespace

bool flash_forward_hopper_fits(int head_dim, bool sparse, int block_q) {
  return (head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 192 || head_dim == 256) &&
         (!sparse || block_q % hopper::kBlockM == 0) &&
         current_hopper_device().supported;
}

void launch_flash_forward_hopper(const FlashParams& params, DType dtype, int head_dim, bool sparse, int batch,
                                 int heads_kv, const WorkOrder& order, const HopperVariant& variant, cudaStream_t stream) {
  if (dtype == DType::kBF16)
    launch_for_head_dim<__nv_bfloat16>(params, head_dim, sparse, batch, heads_kv, dtype, order, variant, stream);
  else
    launch_for_head_dim<__half>(params, head_dim, sparse, batch, heads_kv, dtype, order, variant, stream);
}

std::string hopper_variant_name(const HopperVariant& variant) {
  return std::string(variant.narrow ? "narrow" : "wide") + (variant.ping_pong ? "+pingpong" : "") +
         (variant.lazy_rescale ? "+lazy" : "") + (variant.tma_store ? "+tmastore" : "") +
         (variant.overlap_epilogue ? "+overlap" : "");
}

std::vector<HopperVariant> hopper_variants_for(int head_dim) {
  if (head_dim != 64 && head_dim != 128) return {HopperVariant{}};
  // {narrow, ping_pong, lazy_rescale, tma_store, overlap_epilogue}; lazy rescaling and the stores
  // through shared memory are instantiated with wide stages only, each without the other; the
  // early QK^T only with the stores through shared memory.
  return {HopperVariant{false, false, false, false, false}, HopperVariant{false, true, false, false, false},
          HopperVariant{true, false, false, false, false},  HopperVariant{true, true, false, false, false},
          HopperVariant{false, false, true, false, false},  HopperVariant{false, true, true, false, false},
          HopperVariant{false, false, false, true, false},  HopperVariant{false, true, false, true, false},
          HopperVariant{false, false, false, true, true},   HopperVariant{false, true, false, true, true}};
}

std::string hopper_fp8_variant_name(const HopperFp8Variant& variant) {
  return std::string("fp8") + (variant.smooth_k ? "+smoothk" : "") + (variant.poly_exp2 ? "+poly" : "") +
         (variant.lazy_rescale ? "+lazy" : "") + (variant.ping_pong ? "+pingpong" : "");
}

std::vector<HopperFp8Variant> hopper_fp8_variants() {
  // {smooth_k, poly_exp2, lazy_rescale, ping_pong}: K smoothing costs the kernel nothing, so the
  // kernel's choices are each tried on top of it.
  return {HopperFp8Variant{false, false, false, false}, HopperFp8Variant{true, false, false, false},
          HopperFp8Variant{true, true, false, false},   HopperFp8Variant{true, false, true, false},
          HopperFp8Variant{true, true, true, false},    HopperFp8Variant{true, false, true, true}};
}

void launch_flash_forward_hopper_fp8(const FlashParams& params, DType dtype, bool sparse, int batch, int heads_kv,
                                     const WorkOrder& order, const Fp8Operands& operands,
                                     const HopperFp8Variant& variant, bool quantize_query_key, cudaStream_t stream) {
  const Fp8Shape shape{batch, params.seq_q, params.seq_kv, params.heads_q, heads_kv, 128};
  HopperFp8Variant used = variant;
  used.smooth_k = variant.smooth_k && quantize_query_key;
  launch_fp8_quantize(params, dtype, shape, operands, used.smooth_k, quantize_query_key, stream);
  if (dtype == DType::kBF16)
    launch_flash_forward_hopper_fp8_typed<__nv_bfloat16>(params, sparse, batch, heads_kv, order, operands, used, stream);
  else
    launch_flash_forward_hopper_fp8_typed<__half>(params, sparse, batch, heads_kv, order, operands, used, stream);
}

}  // namespace tessel::cuda::detail
