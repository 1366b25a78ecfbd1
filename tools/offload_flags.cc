#include "offload_flags.h"

#include "option_checks.h"
#include "tessel/core/error.h"

namespace tessel::cli {

void add_offload_flag(CLI::App& app, std::string& offload) {
  app.add_option("--offload", offload,
                 "none, or blocks: the transformer's blocks stay in pinned host memory and are copied to the GPU two at a "
                 "time, ahead of their use (a card with a fraction of the model's memory; the same results)")
      ->capture_default_str()
      ->check(one_of({"none", "blocks"}));
}

WanWeightResidency offload_residency(const std::string& offload, Device device) {
  if (offload != "blocks") return WanWeightResidency::kDevice;
  if (!device.is_cuda())
    fail_argument("--offload blocks", "--device cuda[:N] (the CPU keeps the weights in host memory already)", device.str());
  return WanWeightResidency::kOffloadBlocks;
}

}  // namespace tessel::cli
