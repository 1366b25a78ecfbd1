// The LoRA flags that `tessel generate` and `tessel serve` share: --lora, --lora-2 and
// --lora-ignore-unmatched (merged into the transformers at load; see tessel/dit/wan_lora.h).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tessel/dit/wan_lora.h"

namespace tessel::cli {

struct LoraFlags {
  std::vector<std::string> loras, loras_2;  // "path[:scale]", as given
  bool ignore_unmatched = false;
};

void add_lora_flags(CLI::App& app, LoraFlags& flags);
// The files of --lora (or --lora-2), each "path[:scale]" checked where it becomes typed.
std::vector<LoraFile> lora_files(const std::vector<std::string>& arguments, const std::string& flag);

}  // namespace tessel::cli
