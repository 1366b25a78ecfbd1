#include "attention_dtype_flag.h"

#include "option_checks.h"
#include "tessel/core/error.h"

namespace tessel::cli {

void add_attention_dtype_flag(CLI::App& app, std::string& attention_dtype) {
  app.add_option("--attention-dtype", attention_dtype,
                 "bf16, or fp8: the transformer's dense self-attention in FP8 (e4m3 q, k, v and P, fp32 accumulation; q and k "
                 "quantised by their RMSNorm + RoPE kernel), about 5 % relative L2 error on the attention output (CUDA, compute "
                 "capability 9.0, head dim 128, no sparse attention or sequence parallelism)")
      ->capture_default_str()
      ->check(one_of({"bf16", "fp8"}));
}

AttentionPrecision attention_precision(const std::string& attention_dtype, Device device) {
  if (attention_dtype != "fp8") return AttentionPrecision::kInput;
  if (!device.is_cuda())
    fail_argument("--attention-dtype fp8", "--device cuda[:N] (the CPU model attends in fp32)", device.str());
  return AttentionPrecision::kFp8;
}

}  // namespace tessel::cli
