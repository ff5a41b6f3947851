// run_self_with_timeout: fork, exec of /proc/self/exe in a process group of its own, a polling wait bounded
// by the limit and ended by an interrupt of the parent (the group is stopped first), and the log's last line.
#include "tools/timed_child.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "executor/parallel/interrupt_guard.h"

namespace megatune::tools {
namespace {

std::string last_non_empty_line(const std::string& path) {
  std::ifstream in(path);
  std::string last;
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last;
}

// How long the child's group has after SIGTERM before SIGKILL, when the parent is interrupted.
constexpr double kStopGraceS = 3.0;

// In the child: its own process group, SIGTERM when the parent dies (even by SIGKILL), output to the log,
// then exec (exit 127 when that fails). Only system calls here: the parent may have had other threads, so
// nothing that allocates runs after the fork.
[[noreturn]] void exec_child(const char* program, char* const* argv, const char* log_path, pid_t parent) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(128 + SIGTERM);  // the parent died before the line above
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

// SIGTERM to the group of child `pid`, SIGKILL after the grace period, and the child reaped.
void stop_group(pid_t pid) {
  kill(-pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kStopGraceS);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(-pid, SIGKILL);  // anything of the group still left (a grandchild)
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
  const executor::InterruptGuard interrupts;  // Ctrl-C or SIGTERM: the child's group ends first
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) exec_child(program.c_str(), argv.data(), log_path.c_str(), parent);
  setpgid(pid, pid);  // also here, so that the group exists before any kill below
  ChildOutcome outcome;
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
    if (interrupts.signal() != 0) {
      stop_group(pid);
      throw executor::Interrupted(interrupts.signal(),
                                  "stopped its running child, megatune " + arguments.front());
    }
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
