// --weights, shared by `tessel generate`, `tessel serve` and `tessel dit-bench`: the precision of a
// CUDA transformer's block linear weights (tessel/dit/wan_model.h, WanWeightPrecision).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "tessel/core/device.h"
#include "tessel/dit/wan_model.h"

namespace tessel::cli {

void add_weights_flag(CLI::App& app, std::string& weights);
// The precision --weights asks for on `device`; "fp8" on a CPU device is an Error naming --weights
// and --device.
WanWeightPrecision weights_precision(const std::string& weights, Device device);

}  // namespace tessel::cli
