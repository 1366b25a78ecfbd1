// The `tessel` command-line tool: dispatches to the registered sub-commands.
#include <cstdlib>
#include <string_view>
#include <iostream>
#include <map>

#include "command.h"
#include "memory_flags.h"
#include "option_checks.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"
#include "tessel/kernels/attention_tuning.h"
#include "tessel/sparse/registry.h"

namespace tessel::cli {
std::vector<Command>& command_list() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace tessel::cli

namespace {

// The library reads no environment; the CLI reads TESSEL_LOG_LEVEL and TESSEL_ATTENTION_TUNING once,
// here (TESSEL_TRACE_SYNC with the parallel flags, the sparse-attention variables with theirs).
void apply_attention_tuning_from_environment() {
  const char* value = std::getenv("TESSEL_ATTENTION_TUNING");
  if (value != nullptr && std::string_view(value) == "1") tessel::set_attention_tuning_enabled(true);
}

void apply_log_level_from_environment() {
  const char* value = std::getenv("TESSEL_LOG_LEVEL");
  if (value == nullptr || *value == '\0') return;
  try {
    tessel::set_log_level(tessel::parse_log_level(value));
  } catch (const tessel::Error& e) {
    std::cerr << "tessel: warning: TESSEL_LOG_LEVEL ignored: " << e.what() << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessel::cli;
  apply_log_level_from_environment();
  apply_attention_tuning_from_environment();
  CLI::App app{"tessel: sparse attention for diffusion transformers and long-context prefill"};
  app.require_subcommand(1);
  std::map<CLI::App*, CommandRunner> runners;
  std::string names;
  bool known = argc < 2 || argv[1][0] == '-';
  for (const Command& command : command_list()) {
    CLI::App* sub = app.add_subcommand(command.name, command.description);
    runners[sub] = command.setup(*sub);
    names += (names.empty() ? "" : ", ") + command.name;
    known = known || command.name == argv[1];
  }
  if (!known) {  // CLI11 would only say that an argument was not expected
    std::cerr << "tessel: error: unknown command " << tessel::quoted_excerpt(argv[1]) << " (expected one of " << names << ")\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ValidationError& e) {
    // A value refused by the validation layer (option_checks.h) is bad input like any other:
    // the same prefix and exit status as a tessel::Error.
    std::cerr << "tessel: error: " << e.what() << "\n";
    return 2;
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  CLI::App* ran = nullptr;
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) {
        ran = sub;
        check_list_values(*sub, argc, argv);
        return run();
      }
  } catch (const tessel::Error& e) {
    const std::string message = e.what();
    std::cerr << "tessel: error: " << message << (ran != nullptr && is_out_of_memory(message) ? memory_flags_suffix(*ran) : "")
              << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "tessel: error: out of memory: the requested shapes need more memory than this machine can give"
              << (ran != nullptr ? memory_flags_suffix(*ran) : "") << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "tessel: unexpected error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
