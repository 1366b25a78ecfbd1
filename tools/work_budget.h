// What a command will hold and compute, estimated from its flags before it starts, and the one
// check of it: every command whose memory and work grow with its flags (calibrate, eval, generate,
// dit-bench, sp-bench, vae-bench, bench, mask, prefill-bench) refuses past a budget naming the flags that asked for
// it, with --max-memory / --force to go beyond, says what it is about to do when it is long, and
// with --dry-run prints the estimate and the verdict without running.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tessel/core/device.h"
#include "tessel/dit/wan_config.h"
#include "tessel/dit/wan_flop.h"

namespace tessel::cli {

struct WorkEstimate {
  double host_bytes = 0.0;    // peak resident host memory
  double device_bytes = 0.0;  // peak device memory (CUDA runs)
  double flop = 0.0;          // arithmetic, for the time estimate
};

struct BudgetFlags {
  std::string max_memory;  // --max-memory SIZE: the host budget ("64G", "512M", bytes); default half the RAM
  bool force = false;      // --force: run past every budget
  bool dry_run = false;    // --dry-run: print the estimate and whether the budgets admit it, run nothing
};
// The three flags; `prefix` starts their help ("--config: " where they apply to one mode).
std::vector<CLI::Option*> add_budget_flags(CLI::App& app, BudgetFlags& flags, const std::string& prefix = "");

// The device `text` (the value of `flag`) names: one present on this machine (present_device), or
// under --dry-run any well-formed one, so that a run can be sized for a GPU elsewhere (its memory
// is then checked only when it is here).
Device budget_device(const BudgetFlags& budget, const std::string& text, const std::string& flag);

// A Wan transformer on the CPU: its fp32 weights with the transposed copies made one tensor at a
// time (8 bytes a parameter), and one forward's activations over `rows` tokens (batch x tokens):
// about ten (rows x dim) fp32 buffers and the FFN's (rows x ffn_dim).
double wan_cpu_weight_bytes(const WanConfig& config);
double wan_cpu_activation_bytes(const WanConfig& config, double rows);
// The same on a CUDA device (bf16 weights; the workspace of one forward over `rows` tokens: the fp32
// residual stream, the bf16 normed input, q, k, v and attention output, and the FFN's hidden rows).
// With fp8 weights (`fp8`): the block linears in e4m3 with an fp32 scale per output channel, and the
// workspace's e4m3 copy of each GEMM's input rows with their scales. With fp8 self-attention
// (`fp8_attention`): the attention's e4m3 q, k and transposed v (a byte per value each).
double wan_cuda_weight_bytes(const WanConfig& config, bool fp8 = false);
double wan_cuda_activation_bytes(const WanConfig& config, double rows, bool fp8 = false, bool fp8_attention = false);
// The arithmetic of one forward: the library's wan_forward_flop (tessel/dit/wan_flop.h).

// The peak resident memory of this process so far (getrusage), which the reports print beside the
// estimate.
double peak_host_memory_bytes();

// Bytes of a --max-memory value: a number with an optional K, M, G or T suffix (powers of 1024).
// Throws Error naming --max-memory otherwise.
double parse_memory_size(const std::string& text);

// Seconds `flop` of attention-shaped work takes on `device` (round rates: CPU 50 GFLOP/s per thread,
// as the fp32 kernels run with AVX-512; an H100/H200-class GPU 300 TFLOP/s), for the estimate.
double estimated_seconds(double flop, const Device& device, int threads);

// Refuses, naming `flags` (e.g. "--grid 90x160x120 --synthetic-layers 40"), the estimate and the
// remedy, when the host memory is over --max-memory (default: half of this machine's), the device
// memory over the device's total, or the time over an hour; all of it unless --force. Prints the
// estimate to stderr when the run will take more than 10 seconds. Under --dry-run prints the
// estimate and that the budgets admit it to stdout and returns false: the command stops there.
// `what` names the run ("sp-bench, per rank of 4"): under sequence parallelism the estimate is
// one rank's.
[[nodiscard]] bool check_work_budget(const WorkEstimate& estimate, const BudgetFlags& budget, const Device& device, int threads,
                                     const std::string& flags, const std::string& what);

}  // namespace tessel::cli
