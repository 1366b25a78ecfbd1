// What a command will hold and compute, estimated from its flags before it starts, and the one
// check of it: commands whose memory and work grow with their flags (calibrate, eval --config)
// refuse past a budget naming the flags that asked for it, with --max-memory / --force to go
// beyond, and say what they are about to do when it is long.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "tessel/core/device.h"
#include "tessel/dit/wan_config.h"

namespace tessel::cli {

struct WorkEstimate {
  double host_bytes = 0.0;    // peak resident host memory
  double device_bytes = 0.0;  // peak device memory (CUDA runs)
  double flop = 0.0;          // arithmetic, for the time estimate
};

struct BudgetFlags {
  std::string max_memory;  // --max-memory SIZE: the host budget ("64G", "512M", bytes); default half the RAM
  bool force = false;      // --force: run past every budget
};
void add_budget_flags(CLI::App& app, BudgetFlags& flags);

// A Wan transformer on the CPU: its fp32 weights with the transposed copies made one tensor at a
// time (8 bytes a parameter), and one forward's activations over `rows` tokens (batch x tokens):
// about ten (rows x dim) fp32 buffers and the FFN's (rows x ffn_dim).
double wan_cpu_weight_bytes(const WanConfig& config);
double wan_cpu_activation_bytes(const WanConfig& config, double rows);

// Bytes of a --max-memory value: a number with an optional K, M, G or T suffix (powers of 1024).
// Throws Error naming --max-memory otherwise.
double parse_memory_size(const std::string& text);

// Seconds `flop` of attention-shaped work takes on `device` (round rates: CPU 50 GFLOP/s per thread,
// as the fp32 kernels run with AVX-512; an H100/H200-class GPU 300 TFLOP/s), for the estimate.
double estimated_seconds(double flop, const Device& device, int threads);

// Refuses, naming `flags` (e.g. "--grid 90x160x120 --synthetic-layers 40"), the estimate and the
// remedy, when the host memory is over --max-memory (default: half of this machine's), the device
// memory over the device's total, or the time over an hour; all of it unless --force. Prints the
// estimate to stderr when the run will take more than 10 seconds.
void check_work_budget(const WorkEstimate& estimate, const BudgetFlags& budget, const Device& device, int threads,
                       const std::string& flags, const std::string& what);

}  // namespace tessel::cli
