// --offload, shared by `tessel generate`, `tessel serve` and `tessel dit-bench`: where a CUDA
// transformer keeps its blocks' weights (tessel/dit/wan_model.h, WanWeightResidency).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "tessel/core/device.h"
#include "tessel/dit/wan_model.h"

namespace tessel::cli {

void add_offload_flag(CLI::App& app, std::string& offload);
// The residency --offload asks for on `device`; "blocks" on a CPU device is an Error naming
// --offload and --device.
WanWeightResidency offload_residency(const std::string& offload, Device device);

}  // namespace tessel::cli
