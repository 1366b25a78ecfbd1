// What the `tessel generate` CLI tests share: the fixtures, a diffusers-layout model directory
// around the fixture transformer, and running the command.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "run_tessel.h"

namespace tessel {

inline const std::string kFixtures = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures";
inline const std::string kPipelineFixture = kFixtures + "/diffusion/wan_pipeline.safetensors";

// model_index.json, scheduler/ (Wan 2.1's UniPC config) and transformer/ (a link to the fixture).
// `experts` is model_index.json's text about the second expert: none by default.
inline std::filesystem::path make_model_dir(const std::string& name, const std::string& class_name = "WanPipeline",
                                            const std::string& experts = R"("transformer_2": [null, null])") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "scheduler");
  std::ofstream(dir / "model_index.json")
      << R"({"_class_name": ")" << class_name << R"(", "_diffusers_version": "0.42.1",
        "scheduler": ["diffusers", "UniPCMultistepScheduler"], "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"], "transformer": ["diffusers", "WanTransformer3DModel"],
        )" << experts << R"(, "vae": ["diffusers", "AutoencoderKLWan"]})";
  std::ofstream(dir / "scheduler" / "scheduler_config.json")
      << R"({"_class_name": "UniPCMultistepScheduler", "flow_shift": 3.0, "num_train_timesteps": 1000,
        "prediction_type": "flow_prediction", "solver_order": 2, "solver_type": "bh2", "use_flow_sigmas": true,
        "predict_x0": true, "lower_order_final": true, "final_sigmas_type": "zero", "disable_corrector": []})";
  fs::create_directory_symlink(kFixtures + "/wan/checkpoint", dir / "transformer");
  return dir;
}

inline TesselRun generate(const std::string& args) {
  const std::filesystem::path log =
      std::filesystem::path(::testing::TempDir()) / ("tessel_generate_" + std::to_string(::getpid()) + ".txt");
  return run_tessel_binary("generate " + args, log);
}

}  // namespace tessel
