// `tessel init-model`: writes a diffusers-layout Wan model directory with random weights, so
// `tessel generate` runs on a fresh machine with nothing downloaded.
#include <cstdio>
#include <memory>
#include <string>

#include "command.h"
#include "option_checks.h"
#include "tessel/diffusion/tiny_model.h"

namespace tessel::cli {
namespace {

struct InitModelOptions {
  std::string preset = "tiny";
  std::string out;
  int64_t seed = 0;
};

CommandRegistration registration{
    "init-model", "Write a Wan model directory (diffusers layout) with random weights",
    [](CLI::App& app) {
      auto options = std::make_shared<InitModelOptions>();
      app.add_option("--preset", options->preset,
                     "model size: tiny (2 layers, a few hundred kB) or tiny-a14b (Wan 2.2's two-expert layout of tiny transformers)")
          ->capture_default_str()
          ->check(one_of({"tiny", "tiny-a14b"}));
      app.add_option("--out", options->out, "the directory to write (created when missing)")->required();
      app.add_option("--seed", options->seed, "seed of the random weights")->capture_default_str()->check(integer_in(0, INT64_MAX));
      return CommandRunner([options] {
        write_tiny_wan_model(options->out, static_cast<uint64_t>(options->seed),
                             options->preset == "tiny-a14b" ? TinyWanLayout::kTwoExperts : TinyWanLayout::kOneExpert);
        std::printf("wrote %s: a %s Wan text-to-video model with RANDOM weights (it generates noise, not pictures)\n",
                    options->out.c_str(), options->preset.c_str());
        return 0;
      });
    }};

}  // namespace
}  // namespace tessel::cli
