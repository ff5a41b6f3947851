// Launch of multi-process jobs without a GPU: the launchers' environments (torchrun, Slurm, Open MPI,
// none) and their bad values, the CPU backend refusing to be one of several processes, the distributed
// timeout of ranks as threads, the TCP rendezvous on localhost (threads and a forked process as ranks) with
// its failure lines, and the one-host launcher with /bin/sh children.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include "base/user_error.h"
#include "executor/parallel/framed_socket.h"
#include "executor/parallel/launch_environment.h"
#include "executor/parallel/local_launcher.h"
#include "executor/parallel/tcp_rendezvous.h"
#include "executor/training/thread_run.h"
#include "tests/executor/parallel_test_models.h"

namespace megatune::executor {
namespace {

using Env = std::map<std::string, std::string>;

EnvLookup fake(const Env& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    const auto found = env.find(name);
    if (found == env.end()) return std::nullopt;
    return found->second;
  };
}

// The UserError line reading `env` produces ("" when none).
std::string env_error(const Env& env) {
  try {
    read_launch_environment(fake(env));
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(LaunchEnvironment, NoLauncherIsOneProcess) {
  const LaunchEnvironment launch = read_launch_environment(fake({}));
  EXPECT_EQ(launch.rank, 0);
  EXPECT_EQ(launch.world_size, 1);
  EXPECT_EQ(launch.launcher, "none");
  EXPECT_TRUE(launch.single_process());
}

TEST(LaunchEnvironment, Torchrun) {
  const LaunchEnvironment launch = read_launch_environment(fake({{"RANK", "5"},
                                                                 {"WORLD_SIZE", "8"},
                                                                 {"LOCAL_RANK", "1"},
                                                                 {"MASTER_ADDR", "node0"},
                                                                 {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(launch.launcher, "torchrun");
  EXPECT_EQ(launch.rank, 5);
  EXPECT_EQ(launch.world_size, 8);
  EXPECT_EQ(launch.local_rank, 1);
  EXPECT_EQ(launch.master_addr, "node0");
  EXPECT_EQ(launch.master_port, 29500);
}

TEST(LaunchEnvironment, TorchrunOneProcessNeedsNoMaster) {
  const LaunchEnvironment launch = read_launch_environment(fake({{"RANK", "0"}, {"WORLD_SIZE", "1"}}));
  EXPECT_EQ(launch.world_size, 1);
  EXPECT_EQ(launch.launcher, "torchrun");
}

TEST(LaunchEnvironment, Slurm) {
  const LaunchEnvironment launch = read_launch_environment(fake({{"SLURM_PROCID", "3"},
                                                                 {"SLURM_NTASKS", "4"},
                                                                 {"SLURM_LOCALID", "3"},
                                                                 {"MASTER_ADDR", "10.0.0.1"},
                                                                 {"MASTER_PORT", "6000"}}));
  EXPECT_EQ(launch.launcher, "slurm");
  EXPECT_EQ(launch.rank, 3);
  EXPECT_EQ(launch.world_size, 4);
  EXPECT_EQ(launch.local_rank, 3);
  EXPECT_EQ(launch.master_port, 6000);
}

TEST(LaunchEnvironment, OpenMpi) {
  const LaunchEnvironment launch = read_launch_environment(fake({{"OMPI_COMM_WORLD_RANK", "1"},
                                                                 {"OMPI_COMM_WORLD_SIZE", "2"},
                                                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                                                 {"MASTER_ADDR", "host"},
                                                                 {"MASTER_PORT", "1234"}}));
  EXPECT_EQ(launch.launcher, "openmpi");
  EXPECT_EQ(launch.rank, 1);
  EXPECT_EQ(launch.world_size, 2);
  EXPECT_EQ(launch.local_rank, 0);
}

TEST(LaunchEnvironment, TorchrunInsideSlurmAllocationWins) {
  const LaunchEnvironment launch = read_launch_environment(fake({{"SLURM_PROCID", "0"},
                                                                 {"SLURM_NTASKS", "1"},
                                                                 {"RANK", "2"},
                                                                 {"WORLD_SIZE", "4"},
                                                                 {"MASTER_ADDR", "h"},
                                                                 {"MASTER_PORT", "1"}}));
  EXPECT_EQ(launch.launcher, "torchrun");
  EXPECT_EQ(launch.rank, 2);
  EXPECT_EQ(launch.local_rank, 2);  // no LOCAL_RANK: one host assumed
}

TEST(LaunchEnvironment, BadValuesNameTheVariable) {
  const Env master = {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
  auto with = [&](Env env) {
    env.insert(master.begin(), master.end());
    return env;
  };
  EXPECT_NE(env_error(with({{"RANK", "1"}})).find("RANK=1 is set but WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(env_error(with({{"WORLD_SIZE", "2"}})).find("WORLD_SIZE=2 is set but RANK is not"),
            std::string::npos);
  EXPECT_NE(env_error(with({{"RANK", "one"}, {"WORLD_SIZE", "2"}})).find("RANK=one: not an integer"),
            std::string::npos);
  EXPECT_NE(env_error(with({{"RANK", "1"}, {"WORLD_SIZE", "2x"}})).find("WORLD_SIZE=2x: not an integer"),
            std::string::npos);
  EXPECT_NE(env_error(with({{"RANK", "4"}, {"WORLD_SIZE", "4"}})).find("RANK=4: must lie in [0, 3]"),
            std::string::npos);
  EXPECT_NE(env_error(with({{"RANK", "0"}, {"WORLD_SIZE", "0"}})).find("WORLD_SIZE=0: must lie in"),
            std::string::npos);
  EXPECT_NE(env_error(with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "-1"}})).find("LOCAL_RANK=-1"),
            std::string::npos);
  EXPECT_NE(env_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}).find("MASTER_ADDR is not set"),
            std::string::npos);
  EXPECT_NE(env_error({{"SLURM_PROCID", "0"}, {"MASTER_ADDR", "h"}}).find("SLURM_NTASKS is not"),
            std::string::npos);
  EXPECT_NE(env_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})
                .find("MASTER_PORT is not set"),
            std::string::npos);
  EXPECT_NE(env_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})
                .find("MASTER_PORT=70000: must lie in [1, 65535]"),
            std::string::npos);
  EXPECT_NE(env_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", ""}, {"MASTER_PORT", "1"}})
                .find("MASTER_ADDR is empty"),
            std::string::npos);
}

TEST(LaunchEnvironment, LayoutWorldSizeMustMatch) {
  LaunchEnvironment launch;
  EXPECT_NO_THROW(check_layout_world_size(launch, 1));
  launch.world_size = 4;
  launch.launcher = "torchrun";
  try {
    check_layout_world_size(launch, 8);
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string line = e.what();
    EXPECT_NE(line.find("4 processes were started (torchrun) but the layout needs 8"), std::string::npos)
        << line;
    EXPECT_NE(line.find("--nproc 8"), std::string::npos) << line;
  }
}

TEST(LaunchEnvironment, TheCpuBackendRefusesToBeOneOfSeveralProcesses) {
  EXPECT_NO_THROW(require_single_process_for_cpu(read_launch_environment(fake({}))));
  EXPECT_NO_THROW(require_single_process_for_cpu(
      read_launch_environment(fake({{"RANK", "0"}, {"WORLD_SIZE", "1"}}))));  // torchrun of one process
  for (const char* rank : {"0", "1"}) {
    SCOPED_TRACE(rank);
    const LaunchEnvironment launch = read_launch_environment(fake({{"RANK", rank},
                                                                   {"WORLD_SIZE", "2"},
                                                                   {"MASTER_ADDR", "no-such-host.invalid"},
                                                                   {"MASTER_PORT", "1"}}));
    try {
      require_single_process_for_cpu(launch);
      FAIL() << "a CPU rank started as one of two processes was accepted";
    } catch (const UserError& e) {
      const std::string line = e.what();
      EXPECT_NE(line.find(std::string("rank ") + rank + " of 2"), std::string::npos) << line;
      EXPECT_NE(line.find("--nproc N"), std::string::npos) << line;
      EXPECT_NE(line.find("--device cuda"), std::string::npos) << line;
      EXPECT_EQ(line.find('\n'), std::string::npos) << line;
    }
  }
}

// --distributed-timeout-minutes bounds every wait of ranks as threads: after training rank 0 enters one more
// world reduction that rank 1 does not, and rank 0's wait ends at the timeout (0.005 minutes) with that
// figure.
TEST(DistributedTimeout, BoundsAWaitOfRanksAsThreads) {
  const layouts::ModelSpec model = test::llama_tiny(true);
  layouts::ParallelConfig config;
  config.world_size = 2;
  config.micro_batch_size = 1;
  config.global_batch_size = 2;
  config.validate(model);
  TrainOptions options;
  options.train_iters = 1;
  options.mock_data = true;
  options.distributed_timeout_minutes = 0.005;
  std::atomic<bool> rank0_done{false};
  std::ostringstream log;
  std::string message;
  const auto start = std::chrono::steady_clock::now();
  try {
    train_on_threads(model, config, options, log, [&](int rank, TrainingRun& run) {
      if (rank == 1) {
        while (!rank0_done && seconds_since(start) < 10)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return;
      }
      try {
        run.trainer().world_sum(1.0);
      } catch (...) {
        rank0_done = true;
        throw;
      }
      rank0_done = true;
    });
  } catch (const std::exception& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("timed out after 0.3 s"), std::string::npos) << message;
  EXPECT_LT(seconds_since(start), 5.0);
}

// ---- rendezvous: every rank a thread of this process, or a forked process.

LaunchEnvironment local_rank(int rank, int world_size, int port) {
  LaunchEnvironment launch;
  launch.rank = rank;
  launch.world_size = world_size;
  launch.local_rank = rank;
  launch.master_addr = "127.0.0.1";
  launch.master_port = port;
  launch.launcher = "torchrun";
  return launch;
}

struct RankResult {
  std::string blob, error;
};

// Runs one rendezvous per entry of `ranks` ((rank, world size, fingerprint)) on threads.
std::vector<RankResult> rendezvous_threads(const std::vector<std::tuple<int, int, std::string>>& ranks,
                                           double timeout_s) {
  const int port = free_local_port();
  std::vector<RankResult> results(ranks.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < ranks.size(); ++i)
    threads.emplace_back([&, i] {
      const auto& [rank, world, fingerprint] = ranks[i];
      RendezvousOptions options;
      options.timeout_s = timeout_s;
      options.fingerprint = fingerprint;
      try {
        TcpRendezvous rendezvous(local_rank(rank, world, port), options, "id-from-rank-0");
        results[i].blob = rendezvous.blob();
      } catch (const UserError& e) {
        results[i].error = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  return results;
}

TEST(TcpRendezvous, EveryRankGetsRankZerosBlob) {
  const std::vector<RankResult> results =
      rendezvous_threads({{2, 4, "cfg"}, {0, 4, "cfg"}, {3, 4, "cfg"}, {1, 4, "cfg"}}, 20);
  for (const RankResult& r : results) {
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.blob, "id-from-rank-0");
  }
}

TEST(TcpRendezvous, SingleProcessOpensNoSocket) {
  LaunchEnvironment launch;
  TcpRendezvous rendezvous(launch, {}, "blob");
  EXPECT_EQ(rendezvous.blob(), "blob");
  EXPECT_EQ(rendezvous.poll_failure(), std::nullopt);
}

TEST(TcpRendezvous, MissingRankTimesOutOnEveryRankWithinTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<RankResult> results =
      rendezvous_threads({{0, 4, "cfg"}, {1, 4, "cfg"}, {3, 4, "cfg"}}, 1.0);
  EXPECT_LT(seconds_since(start), 4.0);
  for (const RankResult& r : results) {
    EXPECT_NE(r.error.find("timed out after 1 s: rank 2 of 4 never arrived"), std::string::npos) << r.error;
    EXPECT_EQ(r.blob, "");
  }
}

TEST(TcpRendezvous, MissingRankZeroIsNamed) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<RankResult> results = rendezvous_threads({{1, 2, "cfg"}}, 0.5);
  EXPECT_LT(seconds_since(start), 3.0);
  EXPECT_NE(results[0].error.find("rank 1 could not reach rank 0 within"), std::string::npos)
      << results[0].error;
}

TEST(TcpRendezvous, WrongWorldSizeFailsOnEveryRank) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<RankResult> results =
      rendezvous_threads({{0, 3, "cfg"}, {1, 3, "cfg"}, {2, 4, "cfg"}}, 20);
  EXPECT_LT(seconds_since(start), 10.0);
  for (const RankResult& r : results)
    EXPECT_NE(r.error.find("was started for 4 processes but rank 0 for 3"), std::string::npos) << r.error;
}

TEST(TcpRendezvous, DuplicateRankFailsOnEveryRank) {
  const std::vector<RankResult> results =
      rendezvous_threads({{0, 3, "cfg"}, {1, 3, "cfg"}, {1, 3, "cfg"}}, 20);
  for (const RankResult& r : results)
    EXPECT_NE(r.error.find("two processes claim rank 1"), std::string::npos) << r.error;
}

TEST(TcpRendezvous, DifferentConfigurationFailsOnEveryRank) {
  const std::vector<RankResult> results = rendezvous_threads({{0, 2, "tp2 pp1"}, {1, 2, "tp1 pp2"}}, 20);
  for (const RankResult& r : results)
    EXPECT_NE(r.error.find("rank 1 (127.0.0.1:"), std::string::npos) << r.error;
  for (const RankResult& r : results)
    EXPECT_NE(r.error.find("runs a different configuration than rank 0 ('tp1 pp2' vs 'tp2 pp1')"),
              std::string::npos)
        << r.error;
}

TEST(TcpRendezvous, AnnouncedFailureReachesEveryRank) {
  const int port = free_local_port();
  std::vector<std::unique_ptr<TcpRendezvous>> ranks(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      RendezvousOptions options;
      options.timeout_s = 20;
      ranks[r] = std::make_unique<TcpRendezvous>(local_rank(r, 3, port), options, "id");
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ranks[0]->poll_failure(), std::nullopt);
  ranks[2]->announce_failure("rank 2 failed: loss is NaN");
  auto wait_for = [](TcpRendezvous& rendezvous) {
    for (int i = 0; i < 50; ++i)
      if (std::optional<std::string> failure = rendezvous.poll_failure(100)) return *failure;
    return std::string("nothing");
  };
  EXPECT_EQ(wait_for(*ranks[0]), "rank 2 failed: loss is NaN");  // rank 0 hears it and relays it
  EXPECT_EQ(wait_for(*ranks[1]), "rank 2 failed: loss is NaN");
}

TEST(TcpRendezvous, GoodbyeIsNoFailureButADeadPeerIs) {
  const int port = free_local_port();
  const pid_t pid = fork();  // before any thread: the child may allocate freely
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 0;
    try {
      RendezvousOptions options;
      options.timeout_s = 20;
      TcpRendezvous rank1(local_rank(1, 3, port), options, "");
      code = rank1.blob() == "id" ? 0 : 2;
      _exit(code);  // dies without a goodbye
    } catch (...) {
      _exit(3);
    }
  }
  std::unique_ptr<TcpRendezvous> rank0, rank2;
  std::thread other([&] {
    RendezvousOptions options;
    options.timeout_s = 20;
    rank2 = std::make_unique<TcpRendezvous>(local_rank(2, 3, port), options, "");
  });
  RendezvousOptions options;
  options.timeout_s = 20;
  rank0 = std::make_unique<TcpRendezvous>(local_rank(0, 3, port), options, "id");
  other.join();
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::optional<std::string> failure;
  for (int i = 0; i < 50 && !failure; ++i) failure = rank0->poll_failure(100);
  ASSERT_TRUE(failure.has_value());
  EXPECT_NE(failure->find("rank 1's control connection closed without a goodbye"), std::string::npos)
      << *failure;
  std::optional<std::string> relayed;
  for (int i = 0; i < 50 && !relayed; ++i) relayed = rank2->poll_failure(100);
  EXPECT_EQ(relayed, failure);  // rank 0 told rank 2
}

TEST(TcpRendezvous, ClosingNormallyIsNoFailure) {
  const int port = free_local_port();
  std::unique_ptr<TcpRendezvous> rank1;
  std::thread other(
      [&] { rank1 = std::make_unique<TcpRendezvous>(local_rank(1, 2, port), RendezvousOptions{}, ""); });
  TcpRendezvous rank0(local_rank(0, 2, port), RendezvousOptions{}, "id");
  other.join();
  rank1.reset();  // goodbye
  EXPECT_EQ(rank0.poll_failure(300), std::nullopt);
}

// A TCP server on a free port that is not megatune's: it answers every connection with an HTTP line.
class ForeignServer {
 public:
  ForeignServer() : port_(free_local_port()) {
    std::string error;
    fd_ = listen_on_port(port_, &error);
    thread_ = std::thread([this] {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!done_ && std::chrono::steady_clock::now() < until) {
        if (std::unique_ptr<FramedSocket> client = accept_pending(fd_)) {
          const std::string reply = "HTTP/1.1 400 Bad Request\r\n\r\n";
          (void)!write(client->fd(), reply.data(), reply.size());
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
  }
  ~ForeignServer() {
    done_ = true;
    thread_.join();
    close(fd_);
  }
  int port() const { return port_; }

 private:
  int port_, fd_ = -1;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

TEST(TcpRendezvous, AnotherProgramOnThePortIsNamed) {
  ForeignServer server;
  RendezvousOptions options;
  options.timeout_s = 5;
  try {
    TcpRendezvous member(local_rank(1, 2, server.port()), options, "");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("the program answering there is not megatune's rank 0"),
              std::string::npos)
        << e.what();
  }
  try {  // and rank 0 cannot listen where it listens
    TcpRendezvous rank0(local_rank(0, 2, server.port()), options, "id");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 cannot listen on port " + std::to_string(server.port())),
              std::string::npos)
        << e.what();
  }
}

// ---- the local launcher, with /bin/sh children.

LocalLaunch shell_launch(int nproc, const std::string& script) {
  LocalLaunch launch;
  launch.program = "/bin/sh";
  launch.argv = {"sh", "-c", script};
  launch.nproc = nproc;
  launch.kill_grace_s = 3;
  return launch;
}

TEST(LocalLauncher, LastRanksStdoutAndEveryRanksStderr) {
  std::ostringstream out, err;
  const LaunchOutcome outcome = run_local_launch(
      shell_launch(3,
                   "echo \"out $RANK/$WORLD_SIZE local $LOCAL_RANK at $MASTER_ADDR nvls=$NCCL_NVLS_ENABLE\"; "
                   "echo \"err $RANK\" >&2; test -n \"$MASTER_PORT\""),
      out, err);
  EXPECT_EQ(outcome.exit_code, 0) << outcome.failure;
  EXPECT_EQ(out.str(),
            "out 2/3 local 2 at 127.0.0.1 nvls=" +
                std::string(std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "0") + "\n");
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(err.str().find("[rank " + std::to_string(r) + "] err " + std::to_string(r) + "\n"),
              std::string::npos)
        << err.str();
}

TEST(LocalLauncher, FailingRankStopsTheOthers) {
  std::ostringstream out, err;
  const auto start = std::chrono::steady_clock::now();
  const LaunchOutcome outcome = run_local_launch(
      shell_launch(
          3, "if [ $RANK = 1 ]; then echo 'megatune train: error: boom' >&2; exit 3; fi; exec sleep 30"),
      out, err);
  EXPECT_LT(seconds_since(start), 10.0);
  EXPECT_EQ(outcome.exit_code, 3);
  EXPECT_EQ(outcome.failed_rank, 1);
  EXPECT_EQ(outcome.failure,
            "rank 1 exited with status 3 (its last error line: megatune train: error: boom)");
}

TEST(LocalLauncher, RankIgnoringSigtermIsKilled) {
  std::ostringstream out, err;
  const auto start = std::chrono::steady_clock::now();
  LocalLaunch launch = shell_launch(2, "if [ $RANK = 0 ]; then kill -9 $$; fi; trap '' TERM; exec sleep 30");
  launch.kill_grace_s = 0.3;
  const LaunchOutcome outcome = run_local_launch(launch, out, err);
  EXPECT_LT(seconds_since(start), 10.0);
  EXPECT_EQ(outcome.failed_rank, 0);
  EXPECT_EQ(outcome.exit_code, 128 + 9);
  EXPECT_NE(outcome.failure.find("rank 0 was killed by signal 9"), std::string::npos) << outcome.failure;
}

TEST(LocalLauncher, ProgramThatCannotStartIsReported) {
  LocalLaunch launch = shell_launch(2, "");
  launch.program = "/nonexistent/megatune";
  std::ostringstream out, err;
  const LaunchOutcome outcome = run_local_launch(launch, out, err);
  EXPECT_EQ(outcome.exit_code, 127);
  EXPECT_NE(outcome.failure.find("cannot start the rank: exec /nonexistent/megatune"), std::string::npos)
      << outcome.failure;
}

TEST(LocalLauncher, OwnCommandLineDropsNproc) {
  const std::vector<std::string> args = own_command_line_without_nproc();
  ASSERT_FALSE(args.empty());
  for (const std::string& a : args) EXPECT_NE(a.rfind("--nproc", 0), 0u) << a;
}

}  // namespace
}  // namespace megatune::executor
