// Registry of megatune subcommands: each tools/cmd_<name>.cpp registers itself with a static Registrar.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace megatune::tools {

// A subcommand adds itself to the app in `setup` and returns the action run when it was chosen.
// The action returns the process exit code.
struct Command {
  std::string name;
  std::string summary;
  int order;  // position in `megatune --help`
  std::function<std::function<int()>(CLI::App& sub)> setup;
};

std::vector<Command>& command_registry();

struct Registrar {
  explicit Registrar(Command command) { command_registry().push_back(std::move(command)); }
};

}  // namespace megatune::tools
