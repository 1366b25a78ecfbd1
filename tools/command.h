// Sub-commands of the `tessel` CLI register themselves here, one file each, so adding a command
// never touches main.cc. A command's `setup` adds its options to the CLI11 sub-app and returns
// the function that runs it (returning the process exit code).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace tessel::cli {

using CommandRunner = std::function<int()>;
using CommandSetup = std::function<CommandRunner(CLI::App& app)>;

struct Command {
  std::string name;
  std::string description;
  CommandSetup setup;
};

std::vector<Command>& command_list();

struct CommandRegistration {
  CommandRegistration(std::string name, std::string description, CommandSetup setup) {
    command_list().push_back({std::move(name), std::move(description), std::move(setup)});
  }
};

}  // namespace tessel::cli
