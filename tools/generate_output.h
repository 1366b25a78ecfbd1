// What `tessel generate --out` writes, chosen by the file's extension: the final latents
// (.safetensors), PNG frames (.png) or an MP4 video (.mp4), the last two decoded by the model's VAE.
#pragma once

#include <string>

#include "tessel/diffusion/wan_pipeline.h"

namespace tessel::cli {

enum class GenerateOutput { kLatents, kPng, kMp4 };

// The output kind of `path`'s extension. Throws Error naming --out for another extension, for .mp4
// in a build without libav, and for frames from a model directory without vae/; all of it before any
// weight is read.
GenerateOutput check_generate_output(const std::string& path, const std::string& model_dir);

// Writes the result and prints one line saying what was written.
void write_generate_output(GenerateOutput kind, const std::string& path, const WanGenerationResult& result,
                           const std::string& scheduler_name);

}  // namespace tessel::cli
