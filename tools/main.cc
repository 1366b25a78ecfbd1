// The `tessel` command-line tool: dispatches to the registered sub-commands.
#include <iostream>
#include <map>

#include "command.h"
#include "sparse_attn_flags.h"
#include "tessel/core/error.h"
#include "tessel/sparse/registry.h"

namespace tessel::cli {
std::vector<Command>& command_list() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace tessel::cli

int main(int argc, char** argv) {
  using namespace tessel::cli;
  CLI::App app{"tessel: sparse attention for diffusion transformers and long-context prefill"};
  app.require_subcommand(1);
  std::map<CLI::App*, CommandRunner> runners;
  for (const Command& command : command_list()) {
    CLI::App* sub = app.add_subcommand(command.name, command.description);
    runners[sub] = command.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    // The environment is read here, once; the library receives what it says as arguments.
    apply_plugin_dirs(tessel::BackendRegistry::global(), process_sparse_attn_env());
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
  } catch (const tessel::Error& e) {
    std::cerr << "tessel: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "tessel: unexpected error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
