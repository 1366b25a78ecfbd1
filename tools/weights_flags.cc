#include "weights_flags.h"

#include "option_checks.h"
#include "tessel/core/error.h"

namespace tessel::cli {

void add_weights_flag(CLI::App& app, std::string& weights) {
  app.add_option("--weights", weights,
                 "bf16, or fp8: the transformer blocks' linear weights quantised at load to float8 e4m3 with a scale per output "
                 "channel, their inputs per token, FP8 GEMMs with fp32 accumulation (CUDA, sm_89+; half the blocks' memory)")
      ->capture_default_str()
      ->check(one_of({"bf16", "fp8"}));
}

WanWeightPrecision weights_precision(const std::string& weights, Device device) {
  if (weights != "fp8") return WanWeightPrecision::kBf16;
  if (!device.is_cuda()) fail_argument("--weights fp8", "--device cuda[:N] (the CPU model computes with fp32 weights)", device.str());
  return WanWeightPrecision::kFp8;
}

void add_transformer_file_flags(CLI::App& app, std::string& file, std::string* file_2) {
  const char* formats =
      "one safetensors file in the original Wan names (blocks.0.self_attn.q.weight, optionally behind model.diffusion_model.), bf16/fp32 "
      "or FP8 as ComfyUI (scale_weight) and LightX2V (weight_scale) publish them, replacing the directory's weights (its config.json "
      "stays); with --weights fp8 its e4m3 block weights are used as stored, otherwise dequantised";
  app.add_option("--transformer-file", file, std::string("the transformer's weights: ") + formats)->check(regular_file());
  if (file_2 != nullptr)
    app.add_option("--transformer-2-file", *file_2, "the same for transformer_2 (Wan 2.2's low-noise expert)")->check(regular_file());
}

}  // namespace tessel::cli
