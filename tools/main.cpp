// megatune: entry point. Builds the CLI11 app from the registered subcommands and runs the chosen one.
#include "layouts/user_error.h"
#include "tools/command_registry.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>

int main(int argc, char** argv) {
  using megatune::tools::command_registry;
  CLI::App app{"megatune: plan, predict and run Megatron-style parallel training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "megatune 0.1.0");
  auto& commands = command_registry();
  std::sort(commands.begin(), commands.end(), [](const auto& a, const auto& b) { return a.order < b.order; });
  std::map<CLI::App*, std::function<int()>> actions;
  for (auto& command : commands) {
    CLI::App* sub = app.add_subcommand(command.name, command.summary);
    actions[sub] = command.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, action] : actions) {
    if (sub->parsed()) {
      try {
        return action();
      } catch (const megatune::UserError& e) {
        std::fprintf(stderr, "megatune %s: %s\n", sub->get_name().c_str(), e.what());
        return 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "megatune %s: error: %s\n", sub->get_name().c_str(), e.what());
        return 1;
      }
    }
  }
  return 1;
}
