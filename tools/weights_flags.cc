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

}  // namespace tessel::cli
