// Runs this executable again as a child process (a subcommand with its arguments) under a wall-clock limit,
// its standard output and error going to a log file; the child and its own children form one process group
// that the limit kills together.
#pragma once
#include <string>
#include <vector>

namespace megatune::tools {

struct ChildOutcome {
  int exit_code = -1;      // -1 when ended by a signal or the limit
  bool timed_out = false;  // killed at the limit
  int signal = 0;          // the signal that ended it
  double seconds = 0;
  std::string last_line;  // the log's last non-empty line: the child's own error line when it failed
};

// Runs /proc/self/exe with `arguments` (arguments[0] is the subcommand), writing its output to `log_path`.
// SIGINT, SIGTERM or SIGHUP to this process meanwhile stops the child's group (SIGTERM, then SIGKILL) and
// throws executor::Interrupted; the child also gets SIGTERM when this process dies.
ChildOutcome run_self_with_timeout(const std::vector<std::string>& arguments, const std::string& log_path,
                                   double timeout_s);

}  // namespace megatune::tools
