// Internal: the CUDA side of include/tessel/kernels/attention_tuning.h — the process-wide table of
// tuned (and forced) Hopper kernel variants, and the lookup every attention call makes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/hopper/kernel_variant.h"
#include "tessel/kernels/attention_tuning.h"

namespace tessel::cuda {

AttentionTuning tune_attention(const ExecContext& ctx, Device device, DType dtype, const AttentionDims& dims,
                               const AttentionTuneOptions& options);
// tune_attention, except that a capturing stream or a device without variants returns at once.
void tune_attention_unless_capturing(const ExecContext& ctx, Device device, DType dtype, const AttentionDims& dims,
                                     const AttentionTuneOptions& options);
std::vector<std::string> attention_kernel_variants(Device device, int64_t head_dim, AttentionPrecision precision);
void force_attention_kernel_variant(Device device, int64_t head_dim, const std::string& variant,
                                    AttentionPrecision precision);
void clear_attention_tuning();

namespace detail {

// What decides a call's variant: the class tune_attention tunes.
struct CallClass {
  int device = 0;
  int head_dim = 0;
  DType dtype = DType::kBF16;
  bool block_sparse = false;
  bool limited = false;  // a causal or window limit
  int64_t seq_q = 0, seq_kv = 0;
};

// The variant a call of `call` runs: a variant being timed by tune_attention on this thread, a
// forced one, the tuned one, else the default.
HopperVariant chosen_hopper_variant(const CallClass& call);
// The FP8 variant an FP8 call on `device` runs: the forced one, else default_hopper_fp8_variant().
HopperFp8Variant chosen_hopper_fp8_variant(int device);

}  // namespace detail
}  // namespace tessel::cuda
