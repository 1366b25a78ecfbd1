// --attention-dtype, shared by `tessel generate`, `tessel serve` and `tessel dit-bench`: what the Wan
// transformer's self-attention computes in (tessel/dit/wan_model.h, WanAttentionOptions::precision).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "tessel/core/device.h"
#include "tessel/kernels/attention.h"

namespace tessel::cli {

void add_attention_dtype_flag(CLI::App& app, std::string& attention_dtype);
// The precision --attention-dtype asks for on `device`; "fp8" on a CPU device is an Error naming
// --attention-dtype and --device (the model refuses the GPUs and configurations it cannot run, naming the flag too).
AttentionPrecision attention_precision(const std::string& attention_dtype, Device device);

}  // namespace tessel::cli
