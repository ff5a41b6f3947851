// The one-host launcher behind `megatune train --nproc N`: N child processes of one command line with
// torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free
// MASTER_PORT) and NCCL_NVLS_ENABLE=0; their output forwarded; the first failure stops them all.
#pragma once
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace megatune::executor {

struct LocalLaunch {
  std::string program;            // the executable every rank runs
  std::vector<std::string> argv;  // its argv, argv[0] included
  int nproc = 1;
  // Whose stdout is forwarded (unprefixed): -1 is the last rank, where Megatron prints the training log
  // (the loss lives on the last pipeline stage). The other ranks' stdout is read and dropped. Every rank's
  // stderr is forwarded with a "[rank K] " prefix.
  int stdout_rank = -1;
  double kill_grace_s = 5.0;  // after the first failure: SIGTERM to the others, SIGKILL this much later
  std::vector<std::pair<std::string, std::string>> extra_env;  // set in every child (tests)
};

struct LaunchOutcome {
  int exit_code = 0;  // 0 when every rank exited 0; else the failing rank's status (128 + signal)
  int failed_rank = -1;
  std::string failure;  // one line: "rank 2 exited with status 1 (its last error line: ...)"
};

// Starts the ranks and waits for all of them. When one exits non-zero or is killed, the others get
// SIGTERM, then SIGKILL after the grace period. SIGINT / SIGTERM / SIGHUP to the launcher are passed on
// the same way. Throws std::runtime_error only when no process could be started.
LaunchOutcome run_local_launch(const LocalLaunch& launch, std::ostream& out, std::ostream& err);

// This process's command line (/proc/self/cmdline) without `--nproc N` / `--nproc=N`.
std::vector<std::string> own_command_line_without_nproc();

// `megatune train --nproc N`: this command line again, without --nproc, in N ranks; the launcher's one
// line on failure goes to `err` ("megatune train --nproc N: rank 2 exited with status 1 (...)"). Returns
// the exit code. Throws a UserError when this process already runs under a launcher.
int relaunch_with_nproc(int nproc, std::ostream& out, std::ostream& err);

}  // namespace megatune::executor
