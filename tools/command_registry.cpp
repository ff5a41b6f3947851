// Storage for the subcommand registry (function-local static: safe from static-init order).
#include "tools/command_registry.h"

namespace megatune::tools {

std::vector<Command>& command_registry() {
  static std::vector<Command> commands;
  return commands;
}

}  // namespace megatune::tools
