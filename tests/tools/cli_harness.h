// Runs the built `megatune` executable with arguments under a wall-clock limit and captures its exit
// status, standard output and standard error, for CLI-level tests of what a user sees.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace megatune::tests {

struct CliResult {
  int exit_code = -1;      // -1 when killed by a signal or the time limit
  bool timed_out = false;  // still running at the limit (then killed)
  int signal = 0;          // the signal that ended it (SIGABRT for std::terminate)
  double seconds = 0;
  std::string out, err;
  // Lines of standard error that are not empty.
  int error_lines() const {
    std::istringstream in(err);
    int lines = 0;
    for (std::string line; std::getline(in, line);)
      if (!line.empty() && line.find_first_not_of(" \r") != std::string::npos) ++lines;
    return lines;
  }
};

// A fresh temporary directory, removed with its contents at destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "megatune-cli-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  ~TempDir() {
    std::error_code error;
    std::filesystem::remove_all(path_, error);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Starts `argv_text` (a program and its arguments) with standard input from /dev/null and its output into
// the files named; returns its pid.
inline pid_t start_process(std::vector<std::string> argv_text, const std::string& out_path,
                           const std::string& err_path) {
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int in = ::open("/dev/null", O_RDONLY);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::dup2(in, 0);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// Runs `megatune args...` (stdout to `stdout_path` when given, e.g. "/dev/full"), killing it after
// `limit_s`. `prefix` runs before the binary (e.g. {"setpriv", "--reuid=65534", ...}).
inline CliResult run_megatune(const std::vector<std::string>& args, double limit_s = 20,
                              const std::string& stdout_path = "",
                              const std::vector<std::string>& prefix = {}) {
  const TempDir capture;
  const std::string out_path = stdout_path.empty() ? capture / "out" : stdout_path;
  const std::string err_path = capture / "err";
  std::vector<std::string> argv_text = prefix;
  argv_text.push_back(MEGATUNE_CLI_PATH);
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = start_process(argv_text, out_path, err_path);
  CliResult result;
  int status = 0;
  while (true) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (done == pid) break;
    if (result.seconds > limit_s) {
      result.timed_out = true;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!result.timed_out && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (!result.timed_out && WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  if (stdout_path.empty()) result.out = read_text(out_path);
  result.err = read_text(err_path);
  return result;
}

// Byte-level text in Megatron's indexed format, made by `megatune data preprocess` from these repository
// `files` (paths from the source root) in `dir`: the prefix `train --data-path` takes; "" when it failed.
// Byte-level text in Megatron's format from the frozen corpus the executor's text tests read
// (tests/executor/data: 80 KB of the executor's C++), so the curves held against thresholds do not move when
// the project's sources are edited. "" when the preprocessing failed.
inline std::string frozen_text_corpus(const TempDir& dir) {
  const CliResult r =
      run_megatune({"data", "preprocess", "--input",
                    std::string(MEGATUNE_SOURCE_DIR) + "/tests/executor/data/byte_level_corpus.txt",
                    "--output-prefix", dir / "corpus"},
                   60);
  return r.exit_code == 0 ? dir / "corpus_text_document" : "";
}

// The values of "| field: value" in a training log, in order.
inline std::vector<double> logged_values(const std::string& out, const std::string& field) {
  std::vector<double> values;
  const std::regex pattern("\\| " + field + ": ([0-9.E+-]+)");
  for (std::sregex_iterator it(out.begin(), out.end(), pattern), end; it != end; ++it)
    values.push_back(std::stod((*it)[1].str()));
  return values;
}

}  // namespace megatune::tests
