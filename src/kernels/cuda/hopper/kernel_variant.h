// The variants of the Hopper forward kernel that the plan-time tuning chooses among
// (variant_tuning.h): the tile shape of the K/V stages and whether the consumer warpgroups take
// turns issuing their GEMMs. Head dims 64 and 128 (bf16, fp16) have all four; the others, and the
// FP8 mode, only the default.
#pragma once

#include <string>
#include <vector>

namespace tessel::cuda::detail {

struct HopperVariant {
  bool narrow = false;     // 64-key stages: more of them and two Q buffers (HopperConfig kNarrow)
  bool ping_pong = false;  // the consumer warpgroups alternate their GEMMs (kernel kPingPong)
  bool operator==(const HopperVariant&) const = default;
};

// "wide", "wide+pingpong", "narrow", "narrow+pingpong".
std::string hopper_variant_name(const HopperVariant& variant);
// The variants a head dim has instantiations of (the default first).
std::vector<HopperVariant> hopper_variants_for(int head_dim);

}  // namespace tessel::cuda::detail
