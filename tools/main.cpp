// megatune: entry point. Builds the CLI11 app from the registered subcommands and runs the chosen one.
// Every error reaches the user as one line (tools/error_messages.h); output that could not be written
// (a full disk behind standard output) is an error too.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>

#include "executor/parallel/interrupt_guard.h"
#include "tools/command_registry.h"
#include "tools/error_messages.h"

namespace {

// CLI11's parse errors as one line: "megatune plan: --gpus: value 0 must be at least 1 (see --help)".
std::string one_line_failure(const CLI::App* app, const CLI::Error& error) {
  std::string command = "megatune";
  for (const CLI::App* sub = app; sub != nullptr;) {
    const auto chosen = sub->get_subcommands();
    if (chosen.empty()) break;
    sub = chosen.front();
    command += " " + sub->get_name();
  }
  return command + ": " + error.what() + " (see " + command + " --help)\n";
}

// Standard output that could not be written (e.g. redirected to /dev/full) is a failure of the command.
int checked_exit(int code, const std::string& command) {
  std::cout.flush();
  const bool failed = std::fflush(stdout) != 0 || std::ferror(stdout) != 0 || !std::cout;
  if (!failed) return code;
  std::fprintf(stderr,
               "megatune %s: writing standard output failed (%s); free some space or redirect it elsewhere\n",
               command.c_str(), std::strerror(errno != 0 ? errno : EIO));
  return code != 0 ? code : 1;
}

}  // namespace

int main(int argc, char** argv) {
  using megatune::tools::command_registry;
  CLI::App app{"megatune: plan, predict and run Megatron-style parallel training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "megatune 0.1.0");
  app.failure_message(one_line_failure);
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
      const std::string name = sub->get_name();
      try {
        return checked_exit(action(), name);
      } catch (const megatune::executor::Interrupted& e) {  // its children stopped: end as the signal says
        std::fflush(stdout);
        std::fprintf(stderr, "megatune %s: %s\n", name.c_str(), e.what());
        return checked_exit(128 + e.signal(), name);
      } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "megatune %s: %s\n", name.c_str(),
                     megatune::tools::user_facing_message(e).c_str());
        return checked_exit(1, name);
      }
    }
  }
  return 1;
}
