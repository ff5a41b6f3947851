// run_self_with_timeout: fork, exec of /proc/self/exe in a process group of its own, a polling wait bounded
// by the limit, and the log's last line.
#include "tools/timed_child.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>

namespace megatune::tools {
namespace {

std::string last_non_empty_line(const std::string& path) {
  std::ifstream in(path);
  std::string last;
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last;
}

// In the child: its own process group, output to the log, then exec (exit 127 when that fails). Only system
// calls here: the parent may have had other threads, so nothing that allocates runs after the fork.
[[noreturn]] void exec_child(const char* program, char* const* argv, const char* log_path) {
  setpgid(0, 0);
  const int log = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (log >= 0) {
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    close(log);
  }
  execv(program, argv);
  static const char kMessage[] = "megatune: cannot exec /proc/self/exe\n";
  (void)!write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  _exit(127);
}

}  // namespace

ChildOutcome run_self_with_timeout(const std::vector<std::string>& arguments, const std::string& log_path,
                                   double timeout_s) {
  // The child is a copy of this process: its /proc/self/exe is this executable, even one replaced on disk.
  const std::string program = "/proc/self/exe";
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> words = {"megatune"};
  words.insert(words.end(), arguments.begin(), arguments.end());
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) exec_child(program.c_str(), argv.data(), log_path.c_str());
  setpgid(pid, pid);  // also here, so that the group exists before any kill below
  ChildOutcome outcome;
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (elapsed.count() > timeout_s) {
      outcome.timed_out = true;
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status) && !outcome.timed_out) outcome.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
  outcome.last_line = last_non_empty_line(log_path);
  return outcome;
}

}  // namespace megatune::tools
