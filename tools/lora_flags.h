// The LoRA flags that `tessel generate` and `tessel serve` share: --lora, --lora-2 and
// --lora-ignore-unmatched (merged into the transformers at load; see tessel/dit/wan_lora.h), and
// the server's --lora-adapter (per-request adapters, unmerged: tessel/dit/wan_lora_bank.h).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tessel/dit/wan_lora.h"

namespace tessel::cli {

struct LoraFlags {
  std::vector<std::string> loras, loras_2;  // "path[:scale]", as given
  std::vector<std::string> adapters;        // "name=path[:scale]", as given (serve only)
  bool ignore_unmatched = false;
};

void add_lora_flags(CLI::App& app, LoraFlags& flags);
void add_lora_adapter_flag(CLI::App& app, LoraFlags& flags);
// The files of --lora (or --lora-2), each "path[:scale]" checked where it becomes typed.
std::vector<LoraFile> lora_files(const std::vector<std::string>& arguments, const std::string& flag);
// The (name, file) pairs of --lora-adapter, each checked where it becomes typed, the names unique.
std::vector<std::pair<std::string, LoraFile>> lora_adapters(const std::vector<std::string>& arguments);

}  // namespace tessel::cli
