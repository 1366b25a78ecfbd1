// Plan-time choice of the CUDA attention kernel's variant. On Hopper GPUs the forward kernel comes
// in variants (the K/V tile shape, whether the two consumer warpgroups take turns on the tensor
// cores: docs/cuda-kernels.md) and which is fastest depends on the head dim and the sequence
// length. tune_attention times them once for a class of calls — (device, head dim, dtype, dense or
// block-sparse, causal/windowed or not, powers of two bounding S_q and S_kv) — on synthetic inputs
// of the plan's shape, and every later attention call of that class runs the winner. Untuned
// classes run the default variant, so tuning is an optimization, never a requirement.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessel/core/device.h"
#include "tessel/core/dtype.h"
#include "tessel/core/exec_context.h"
#include "tessel/kernels/attention.h"

namespace tessel {

struct AttentionTuneOptions {
  bool block_sparse = false;  // tune block_sparse_attention_forward (a random mask of `density`, blocks 128 x 64)
  double density = 0.25;      // of that mask, in (0, 1]
  bool causal = false;        // calls with a causal or window limit
  int rounds = 5;             // timed runs of each candidate (interleaved; the median counts), 1..100
};

struct AttentionTuning {
  std::string chosen;   // the variant this class of calls now runs; empty where the device has no variants
  bool cached = false;  // an earlier tuning (or force_attention_kernel_variant) chose it: nothing was timed
  std::vector<std::pair<std::string, double>> median_ms;  // each candidate's median time when timed
};

// Tunes (or returns the cached choice for) calls of `dims` in `dtype` on `device`. Allocates inputs
// of `dims`' lengths with as many heads as fill the GPU a few times over, runs every candidate on
// ctx.stream and synchronizes it: call it at plan time, never inside a graph capture (an Error then).
// CPU devices and GPUs without variants return at once with `chosen` empty. Thread-safe.
AttentionTuning tune_attention(const ExecContext& ctx, Device device, DType dtype, const AttentionDims& dims,
                               const AttentionTuneOptions& options = {});

// Whether plans tune (tune_attention_if_enabled): off unless set_attention_tuning_enabled(true) was
// called (the CLI does when the environment variable TESSEL_ATTENTION_TUNING is 1). Off by
// default because variants differ in the last bits (their stages split the keys differently) and
// the fastest one can differ between runs, so a tuned process is not bit-reproducible across runs,
// as cuDNN's benchmark mode is not.
bool attention_tuning_enabled();
void set_attention_tuning_enabled(bool enabled);

// The hook plans call (the DiT adapter's workspace_bytes, once per shape): tune_attention when
// tuning is enabled, the device is a CUDA GPU with variants, dtype is bf16 or fp16 and ctx.stream
// is not capturing a graph; nothing otherwise. Cheap after the first call of a class.
void tune_attention_if_enabled(const ExecContext& ctx, Device device, DType dtype, const AttentionDims& dims,
                               const AttentionTuneOptions& options = {});

// The variant names `device` offers for `head_dim` in `precision` (empty on the CPU, without CUDA,
// on GPUs without the Hopper kernel, or for FP8 at head dims without the FP8 mode). The FP8 mode's
// variants ("fp8", "fp8+smoothk", ...: docs/cuda-kernels.md, "FP8 attention") are never tuned:
// calls run "fp8" unless another is forced.
std::vector<std::string> attention_kernel_variants(Device device, int64_t head_dim,
                                                   AttentionPrecision precision = AttentionPrecision::kInput);

// Makes every later call with `head_dim` and `precision` on `device` run `variant` whatever was
// tuned (benchmarks, tests); "" lifts it. A name attention_kernel_variants does not list for that
// precision is an Error naming `variant`.
void force_attention_kernel_variant(Device device, int64_t head_dim, const std::string& variant,
                                    AttentionPrecision precision = AttentionPrecision::kInput);

// Forgets every tuned choice and forced variant: later calls run the default until tuned again.
void clear_attention_tuning();

}  // namespace tessel
