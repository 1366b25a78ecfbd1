// The variants of the Hopper forward kernel that the plan-time tuning chooses among
// (variant_tuning.h): the tile shape of the K/V stages, whether the consumer warpgroups take
// turns issuing their GEMMs, and (wide stages) whether O is rescaled lazily or stored through
// shared memory by the copy engine (then, optionally, with the next item's first QK^T issued
// before the epilogue). Head dims 64 and 128 (bf16, fp16) have all ten; the others only the
// default. The FP8 mode has its own variants
// (HopperFp8Variant), chosen only by force_attention_kernel_variant (benchmarks, tests), never by
// the tuning.
#pragma once

#include <string>
#include <vector>

namespace tessel::cuda::detail {

struct HopperVariant {
  bool narrow = false;     // 64-key stages: more of them and two Q buffers (HopperConfig kNarrow)
  bool ping_pong = false;  // the consumer warpgroups alternate their GEMMs (kernel kPingPong)
  bool lazy_rescale = false;  // O rescaled only when a row max grows past a threshold (kLazyRescale)
  bool tma_store = false;     // O stored from shared memory by the copy engine (kTmaStore)
  bool overlap_epilogue = false;  // (with tma_store) the next item's first QK^T before the epilogue
  bool operator==(const HopperVariant&) const = default;
};

// "wide", "wide+pingpong", "narrow", "narrow+pingpong", "wide+lazy", "wide+pingpong+lazy",
// "wide+tmastore", "wide+pingpong+tmastore", "wide+tmastore+overlap", "wide+pingpong+tmastore+overlap".
std::string hopper_variant_name(const HopperVariant& variant);
// The variants a head dim has instantiations of (plain "wide" first).
std::vector<HopperVariant> hopper_variants_for(int head_dim);
// What an untuned call runs: at head dim 128 "wide+pingpong+tmastore", faster than "wide" in every
// H200 measurement of session 18 (dense 2-4 %, block-sparse 3-10 % at S = 6,630 and 12,870) and
// bit-identical to it (the stores through shared memory write the same values, the turns change no
// arithmetic); elsewhere "wide" (the other head dims were not measured with it).
inline HopperVariant default_hopper_variant(int head_dim) {
  return head_dim == 128 ? HopperVariant{.ping_pong = true, .tma_store = true} : HopperVariant{};
}

// The FP8 mode's variants (docs/cuda-kernels.md, "FP8 attention"): independent choices, of which
// hopper_fp8_variants() lists the instantiated combinations.
struct HopperFp8Variant {
  bool smooth_k = false;      // the quantizer subtracts K's channel means (SageAttention's smoothing)
  bool poly_exp2 = false;     // an eighth of the softmax's exp2 on the FMA units (kernel kPolyExp2)
  bool lazy_rescale = false;  // O rescaled only when a row max grows past a threshold (kLazyRescale)
  bool ping_pong = false;     // the consumer warpgroups alternate their GEMMs (kPingPong)
  bool operator==(const HopperFp8Variant&) const = default;
};

// "fp8" then "+smoothk", "+poly", "+lazy", "+pingpong" for each choice taken, in that order.
std::string hopper_fp8_variant_name(const HopperFp8Variant& variant);
// The FP8 variants with instantiations (the plain "fp8" first).
std::vector<HopperFp8Variant> hopper_fp8_variants();
// What an FP8 call runs unless a variant is forced: "fp8+smoothk+lazy+pingpong", the fastest in
// every H200 measurement (3-12 % ahead of plain "fp8" at S = 6,630 to 29,700; benchmarks.md), and
// the smoothing keeps DiT keys' channel offsets out of e4m3's range.
inline HopperFp8Variant default_hopper_fp8_variant() {
  return HopperFp8Variant{.smooth_k = true, .poly_exp2 = false, .lazy_rescale = true, .ping_pong = true};
}

}  // namespace tessel::cuda::detail
