// Out-of-memory errors naming the size flags (see memory_flags.h).
#include "memory_flags.h"

#include <vector>

namespace tessel::cli {
namespace {

// Every command's flags whose values grow its memory, one table for all of them (a command has
// the ones it has).
const char* const kSizeFlags[] = {"--size", "--height", "--width", "--frames", "--grid", "--seq", "--seq-q", "--seq-kv",
                                  "--heads", "--kv-heads", "--head-dim", "--batch", "--layers", "--num-outputs",
                                  "--latents", "--tokens", "--chunk"};

std::string value_of(const CLI::Option& option) {
  if (option.count() == 0) return option.get_default_str();
  std::string joined;
  for (const std::string& result : option.results()) joined += (joined.empty() ? "" : ",") + result;
  return joined;
}

}  // namespace

bool is_out_of_memory(const std::string& message) {
  for (const char* marker : {"out of host memory", "out of memory", "cudaErrorMemoryAllocation", "bad_alloc",
                             "cudaHostAlloc failed"})
    if (message.find(marker) != std::string::npos) return true;
  return false;
}

std::string memory_flags_suffix(const CLI::App& command) {
  std::vector<const CLI::Option*> present, given;
  for (const char* name : kSizeFlags) {
    const CLI::Option* option = command.get_option_no_throw(name);
    if (option == nullptr) continue;
    present.push_back(option);
    if (option->count() > 0) given.push_back(option);
  }
  const std::vector<const CLI::Option*>& named = given.empty() ? present : given;
  if (named.empty()) return "";
  std::string flags;
  for (const CLI::Option* option : named) {
    const std::string value = value_of(*option);
    flags += (flags.empty() ? "" : " ") + option->get_name() + (value.empty() ? "" : " " + value);
  }
  return " (the memory asked for by " + std::string(given.empty() ? "the defaults " : "") + flags +
         ": lower them, or run where more memory is free)";
}

}  // namespace tessel::cli
