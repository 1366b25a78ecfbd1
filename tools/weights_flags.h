// --weights and --transformer-file, shared by `tessel generate`, `tessel serve` and `tessel dit-bench`: the precision of a
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

// --transformer-file (and --transformer-2-file where `file_2` is given): a single-file checkpoint
// in the original Wan names (bf16 / fp32, or FP8 as ComfyUI and LightX2V publish them) replacing a
// transformer's weights; its config still comes from the model directory
// (WanLoadOptions::transformer_file, WanTransformer::load's weights_file).
void add_transformer_file_flags(CLI::App& app, std::string& file, std::string* file_2);

}  // namespace tessel::cli
