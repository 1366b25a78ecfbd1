#include "lora_flags.h"

#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"

namespace tessel::cli {

void add_lora_flags(CLI::App& app, LoraFlags& flags) {
  app.add_option("--lora", flags.loras,
                 "PATH[:SCALE] (repeatable): a LoRA or weight-diff safetensors (diffusers/PEFT, kohya/musubi, ComfyUI or "
                 "LightX2V keys) merged into the transformer at load, times SCALE (default 1); on Wan 2.2's two experts, "
                 "the high-noise one")
      ->take_all()
      ->allow_extra_args(false);
  app.add_option("--lora-2", flags.loras_2,
                 "PATH[:SCALE] (repeatable): Wan 2.2 two-expert models: a LoRA for the low-noise expert (transformer_2)")
      ->take_all()
      ->allow_extra_args(false);
  app.add_flag("--lora-ignore-unmatched", flags.ignore_unmatched,
               "skip LoRA keys that match no module of the model (default: an error naming them)");
}

void add_lora_adapter_flag(CLI::App& app, LoraFlags& flags) {
  app.add_option("--lora-adapter", flags.adapters,
                 "NAME=PATH[:SCALE] (repeatable): a LoRA kept unmerged beside the transformer, applied to the requests that name it in "
                 "their \"lora\" field (low-rank pairs only: a full diff merges with --lora); one-expert models")
      ->take_all()
      ->allow_extra_args(false);
}

std::vector<std::pair<std::string, LoraFile>> lora_adapters(const std::vector<std::string>& arguments) {
  std::vector<std::pair<std::string, LoraFile>> adapters;
  for (const std::string& argument : arguments) {
    auto adapter = parse_lora_adapter(argument, "--lora-adapter");
    // Here, not in the worker that loads it after the model: the error names the flag and comes at once.
    require_regular_file(adapter.second.path, "--lora-adapter " + adapter.first);
    for (const auto& [name, unused] : adapters)
      if (name == adapter.first) fail_argument("--lora-adapter", "each name once", quoted_excerpt(name) + " twice");
    adapters.push_back(std::move(adapter));
  }
  return adapters;
}

std::vector<LoraFile> lora_files(const std::vector<std::string>& arguments, const std::string& flag) {
  std::vector<LoraFile> files;
  for (const std::string& argument : arguments) files.push_back(parse_lora_file(argument, flag));
  return files;
}

}  // namespace tessel::cli
