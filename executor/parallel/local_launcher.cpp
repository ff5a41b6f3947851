// run_local_launch: fork / exec of the ranks, a poll loop forwarding their output line by line, and the
// stop-everyone-on-first-failure policy.
#include "executor/parallel/local_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "base/user_error.h"
#include "executor/parallel/framed_socket.h"
#include "executor/parallel/interrupt_guard.h"
#include "executor/parallel/launch_environment.h"
#include "executor/parallel/tcp_rendezvous.h"

extern char** environ;

namespace megatune::executor {
namespace {

// One output stream of a child: bytes cut into lines.
struct ChildStream {
  int fd = -1;
  std::string partial;
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = true;
  ChildStream out, err;
  std::string last_error_line;
};

// The environment of rank `rank`: ours, with the launch variables replaced.
std::vector<std::string> child_environment(const LocalLaunch& launch, int rank, int port) {
  std::vector<std::pair<std::string, std::string>> set = {
      {"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(launch.nproc)},
      {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(launch.nproc)},
      {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", std::to_string(port)},
  };
  if (std::getenv("NCCL_NVLS_ENABLE") == nullptr) set.emplace_back("NCCL_NVLS_ENABLE", "0");
  set.insert(set.end(), launch.extra_env.begin(), launch.extra_env.end());
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const auto& [name, value] : set) replaced = replaced || entry.rfind(name + "=", 0) == 0;
    if (!replaced) environment.push_back(entry);
  }
  for (const auto& [name, value] : set) environment.push_back(name + "=" + value);
  return environment;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> result;
  for (std::string& s : strings) result.push_back(s.data());
  result.push_back(nullptr);
  return result;
}

Child start_child(const LocalLaunch& launch, int rank, int port) {
  std::vector<std::string> environment = child_environment(launch, rank, port);
  std::vector<std::string> argv = launch.argv;
  std::vector<char*> envp = pointers(environment), args = pointers(argv);
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {                         // child: async-signal-safe calls only
    prctl(PR_SET_PDEATHSIG, SIGTERM);     // a launcher that dies (even by SIGKILL) takes the ranks along
    if (getppid() != launcher) _exit(1);  // it died before prctl
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    execve(launch.program.c_str(), args.data(), envp.data());
    const char* reason = std::strerror(errno);
    const char prefix[] = "cannot start the rank: exec ";
    (void)!write(STDERR_FILENO, prefix, sizeof(prefix) - 1);
    (void)!write(STDERR_FILENO, launch.program.c_str(), launch.program.size());
    (void)!write(STDERR_FILENO, ": ", 2);
    (void)!write(STDERR_FILENO, reason, std::strlen(reason));
    (void)!write(STDERR_FILENO, "\n", 1);
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  Child child;
  child.rank = rank;
  child.pid = pid;
  child.out.fd = out_pipe[0];
  child.err.fd = err_pipe[0];
  return child;
}

// Reads what `stream` holds and hands each complete line to `line`; closes it at end of file.
template <typename LineFn>
void drain(ChildStream& stream, LineFn&& line) {
  char buffer[65536];
  const ssize_t n = read(stream.fd, buffer, sizeof(buffer));
  if (n < 0 && errno == EINTR) return;
  if (n <= 0) {
    if (!stream.partial.empty()) line(stream.partial);
    stream.partial.clear();
    close(stream.fd);
    stream.fd = -1;
    return;
  }
  stream.partial.append(buffer, static_cast<std::size_t>(n));
  std::size_t start = 0;
  for (std::size_t end; (end = stream.partial.find('\n', start)) != std::string::npos; start = end + 1)
    line(stream.partial.substr(start, end - start));
  stream.partial.erase(0, start);
}

std::string describe_status(int rank, int status, const std::string& last_error_line) {
  std::string text = "rank " + std::to_string(rank);
  if (WIFSIGNALED(status))
    text += " was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) +
            ")";
  else
    text += " exited with status " + std::to_string(WEXITSTATUS(status));
  if (!last_error_line.empty()) text += " (its last error line: " + last_error_line + ")";
  return text;
}

int exit_code_of(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

void signal_running(std::vector<Child>& children, int signal) {
  for (const Child& c : children)
    if (c.running) kill(c.pid, signal);
}

}  // namespace

LaunchOutcome run_local_launch(const LocalLaunch& launch, std::ostream& out, std::ostream& err) {
  if (launch.nproc < 1 || launch.argv.empty()) throw std::runtime_error("run_local_launch: nothing to start");
  const InterruptGuard interrupts;
  const int port = free_local_port();
  const int stdout_rank = launch.stdout_rank < 0 ? launch.nproc - 1 : launch.stdout_rank;
  std::vector<Child> children;
  LaunchOutcome outcome;
  try {
    for (int rank = 0; rank < launch.nproc; ++rank) children.push_back(start_child(launch, rank, port));
  } catch (...) {
    signal_running(children, SIGKILL);
    for (const Child& c : children) waitpid(c.pid, nullptr, 0);
    throw;
  }
  bool stopping = false, killed = false;
  SteadyClock::time_point kill_at{}, drain_until{};
  const auto stop_all = [&] {
    stopping = true;
    signal_running(children, SIGTERM);
    kill_at = deadline_after(launch.kill_grace_s);
  };
  for (;;) {
    std::vector<pollfd> polls;
    std::vector<std::pair<Child*, bool>> streams;  // (child, its stderr)
    for (Child& c : children)
      for (const bool is_err : {false, true})
        if (const int fd = (is_err ? c.err : c.out).fd; fd >= 0) {
          polls.push_back(pollfd{fd, POLLIN, 0});
          streams.emplace_back(&c, is_err);
        }
    poll(polls.data(), polls.size(), 50);
    for (std::size_t i = 0; i < polls.size(); ++i) {
      if (polls[i].revents == 0) continue;
      Child& c = *streams[i].first;
      if (streams[i].second)
        drain(c.err, [&](const std::string& line) {
          err << "[rank " << c.rank << "] " << line << std::endl;
          if (!line.empty()) c.last_error_line = line;
        });
      else
        drain(c.out, [&](const std::string& line) {
          if (c.rank == stdout_rank) out << line << std::endl;
        });
    }
    bool any_running = false;
    for (Child& c : children) {
      int status = 0;
      if (c.running && waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.running = false;
        if ((WIFEXITED(status) && WEXITSTATUS(status) == 0) || outcome.failed_rank >= 0 || stopping) continue;
        outcome = {exit_code_of(status), c.rank, describe_status(c.rank, status, c.last_error_line)};
        stop_all();
      }
      any_running = any_running || c.running;
    }
    if (interrupts.signal() != 0 && !stopping) {
      outcome = {
          128 + interrupts.signal(), -1,
          std::string("interrupted by signal ") + strsignal(interrupts.signal()) + ": stopped every rank"};
      stop_all();
    }
    if (stopping && !killed && any_running && SteadyClock::now() >= kill_at) {
      signal_running(children, SIGKILL);
      killed = true;
    }
    if (any_running) continue;
    if (drain_until == SteadyClock::time_point{}) drain_until = deadline_after(1.0);  // stray writers
    if (polls.empty() || SteadyClock::now() >= drain_until) break;
  }
  for (Child& c : children)
    for (ChildStream* s : {&c.out, &c.err})
      if (s->fd >= 0) close(s->fd);
  return outcome;
}

std::vector<std::string> own_command_line_without_nproc() {
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (std::size_t start = 0; start < bytes.size();) {
    const std::size_t end = bytes.find('\0', start);
    args.push_back(bytes.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  std::vector<std::string> kept;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--nproc") {
      ++i;  // and its value
      continue;
    }
    if (args[i].rfind("--nproc=", 0) == 0) continue;
    kept.push_back(args[i]);
  }
  return kept;
}

int relaunch_with_nproc(int nproc, std::ostream& out, std::ostream& err) {
  const std::string flag = "--nproc " + std::to_string(nproc);
  const LaunchEnvironment running = read_launch_environment();
  if (!running.single_process())
    throw UserError(flag + ": this process already runs as " + running.describe() +
                    "; drop --nproc or start it without the launcher");
  LocalLaunch launch;
  launch.program = "/proc/self/exe";
  launch.argv = own_command_line_without_nproc();
  launch.nproc = nproc;
  const LaunchOutcome outcome = run_local_launch(launch, out, err);
  if (outcome.exit_code != 0) err << "megatune train " << flag << ": " << outcome.failure << std::endl;
  return outcome.exit_code;
}

}  // namespace megatune::executor
