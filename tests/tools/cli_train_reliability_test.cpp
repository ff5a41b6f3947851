// `megatune train` on bad input (CPU backend, tiny model): a --save directory holding another run's
// checkpoints is refused unless --overwrite-checkpoints, a --load that does not exist is refused and an empty
// one starts fresh with a line, nonsense optimizer flags and a full --ops-out device fail with one line, and
// a model whose arena exceeds the (injected) free GPU memory is refused before anything is allocated; the
// CPU backend started as one of several processes by a launcher refuses before training; a non-finite
// gradient norm stops the run in one line unless --no-check-for-nan-in-loss-and-grad skips such steps;
// --ranks-on-one-gpu is refused where it cannot run.
#include <gtest/gtest.h>
#include <stdlib.h>

#include "tests/tools/cli_harness.h"

namespace megatune::tests {
namespace {

std::vector<std::string> train(const std::vector<std::string>& more) {
  std::vector<std::string> args = {"train", "--model",     "tiny",           "--device",
                                   "cpu",   "--mock-data", "--gbs",          "4",
                                   "--mbs", "2",           "--log-interval", "5"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

void expect_refusal(const CliResult& r, const std::string& must_mention) {
  EXPECT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.signal, 0) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.error_lines(), 1) << r.err;
  EXPECT_NE(r.err.find(must_mention), std::string::npos) << r.err;
}

TEST(CliTrain, SaveNeverReplacesAnotherRunsCheckpoints) {
  TempDir dir;
  const std::string save = dir / "ckpt";
  ASSERT_EQ(run_megatune(train({"--train-iters", "10", "--save", save}), 120).exit_code, 0);
  expect_refusal(run_megatune(train({"--train-iters", "4", "--save", save}), 120), "another run");
  EXPECT_EQ(read_text(save + "/latest_checkpointed_iteration.txt"), "10\n");
  const CliResult resumed = run_megatune(train({"--train-iters", "15", "--save", save, "--load", save}), 120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(read_text(save + "/latest_checkpointed_iteration.txt"), "15\n");
  const CliResult replaced =
      run_megatune(train({"--train-iters", "4", "--save", save, "--overwrite-checkpoints"}), 120);
  ASSERT_EQ(replaced.exit_code, 0) << replaced.err;
  EXPECT_EQ(read_text(save + "/latest_checkpointed_iteration.txt"), "4\n");
}

TEST(CliTrain, LoadPaths) {
  TempDir dir;
  expect_refusal(run_megatune(train({"--train-iters", "2", "--load", dir / "typo"}), 120), "does not exist");
  std::filesystem::create_directory(dir / "empty");
  const CliResult fresh =
      run_megatune(train({"--train-iters", "2", "--load", dir / "empty", "--save", dir / "empty"}), 120);
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  EXPECT_NE(fresh.out.find("starting a new run"), std::string::npos) << fresh.out;
  std::filesystem::remove(dir / "empty/latest_checkpointed_iteration.txt");  // a deleted tracker
  expect_refusal(
      run_megatune(train({"--train-iters", "2", "--load", dir / "empty", "--save", dir / "empty"}), 120),
      "no latest_checkpointed_iteration.txt");
}

// --dry-run makes the real run's checks of the flags against each other and the layout: the same line.
TEST(CliTrain, TheDryRunRefusesWhatARealRunRefuses) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--nproc", "4", "--world-size", "2", "--tp", "2"}, "--nproc 4 does not match --world-size 2"},
      {{"--data-path", "corpus_text_document"}, "give only one of --data-path PREFIX and --mock-data"},
      {{"--trace-iterations", "2:3"}, "--trace-iterations needs --trace-dir DIR"}};
  for (const auto& [flags, says] : cases) {
    std::vector<std::string> args = flags;
    args.insert(args.begin(), {"--train-iters", "2"});
    const CliResult real = run_megatune(train(args), 60);
    expect_refusal(real, says);
    args.push_back("--dry-run");
    const CliResult dry = run_megatune(train(args), 60);
    expect_refusal(dry, says);
    EXPECT_EQ(dry.err, real.err);
  }
  // Only the data may be left out of a dry run: it reads none.
  const CliResult no_data = run_megatune({"train", "--model", "tiny", "--device", "cpu", "--dry-run"}, 60);
  EXPECT_EQ(no_data.exit_code, 0) << no_data.err;
  expect_refusal(run_megatune({"train", "--model", "tiny", "--device", "cpu"}, 60),
                 "give exactly one of --data-path PREFIX and --mock-data");
}

TEST(CliTrain, NonsenseFlagsAndFullOutputs) {
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--lr", "nan"}, {"--adam-eps", "0"}, {"--adam-beta1", "2"}, {"--train-iters", "0"}}) {
    SCOPED_TRACE(flag);
    std::vector<std::string> more = {flag, value};
    if (flag != "--train-iters") more.insert(more.end(), {"--train-iters", "2"});
    expect_refusal(run_megatune(train(more), 120), flag);
  }
  expect_refusal(run_megatune(train({"--train-iters", "2", "--ops-out", "/dev/full"}), 120), "No space left");
}

TEST(CliTrain, TheCpuBackendUnderALauncherOfSeveralProcessesIsRefused) {
  for (const char* rank : {"RANK=0", "RANK=1"}) {
    SCOPED_TRACE(rank);
    const CliResult r =
        run_megatune(train({"--train-iters", "2"}), 60, "",
                     {"env", rank, "WORLD_SIZE=2", "MASTER_ADDR=no-such-host.invalid", "MASTER_PORT=29500"});
    expect_refusal(r, "--device cpu runs every rank as a thread of one process");
    EXPECT_NE(r.err.find("--nproc N"), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("iteration"), std::string::npos) << r.out;  // refused before training
  }
  expect_refusal(run_megatune(train({"--train-iters", "2", "--distributed-timeout-minutes", "0"}), 60),
                 "--distributed-timeout-minutes 0 makes no sense");
}

TEST(CliTrain, ANonFiniteGradientNormStopsTheRunUnlessTheCheckIsOff) {
  // --lr 1e30: the first update makes the weights overflow the second iteration; two ranks as threads.
  const std::vector<std::string> diverging = {"--train-iters", "2", "--lr",         "1e30",
                                              "--dp",          "2", "--world-size", "2"};
  expect_refusal(run_megatune(train(diverging), 60),
                 "iteration 2: the gradient norm is NaN (first non-finite on rank 0 of 2); the run stopped");
  std::vector<std::string> unchecked = diverging;
  unchecked.push_back("--no-check-for-nan-in-loss-and-grad");
  const CliResult skipped = run_megatune(train(unchecked), 60);
  ASSERT_EQ(skipped.exit_code, 0) << skipped.err;
  EXPECT_NE(skipped.out.find("number of skipped iterations:   1 |"), std::string::npos) << skipped.out;
}

TEST(CliTrain, AModelThatDoesNotFitTheGpuIsRefusedBeforeAllocating) {
  // The free device memory injected (139 GiB, one H200): llama3-8b's arena is ~158 GiB.
  ::setenv("MEGATUNE_TEST_FREE_DEVICE_MEMORY_BYTES", "149250441216", 1);
  const CliResult r = run_megatune({"train", "--model", "llama3-8b", "--device", "cuda", "--mock-data"}, 60);
  ::unsetenv("MEGATUNE_TEST_FREE_DEVICE_MEMORY_BYTES");
  expect_refusal(r, "needs a 157.82 GiB arena per GPU");
  EXPECT_NE(r.err.find("139.00 GiB free"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("it fits with --recompute-granularity full"), std::string::npos) << r.err;
}

// --ranks-on-one-gpu (every rank a thread on GPU 0) is a CUDA check of one process: refused with the CPU
// backend, under --nproc, and with the timing outputs it does not produce.
TEST(CliTrain, RanksOnOneGpuIsRefusedWhereItCannotRun) {
  const std::vector<std::string> tp2 = {"--train-iters",     "1", "--tp", "2", "--world-size", "2",
                                        "--ranks-on-one-gpu"};
  expect_refusal(run_megatune(train(tp2), 60), "use it with --device cuda");
  std::vector<std::string> with_nproc = {"train",
                                         "--model",
                                         "tiny",
                                         "--device",
                                         "cuda",
                                         "--mock-data",
                                         "--tp",
                                         "2",
                                         "--world-size",
                                         "2",
                                         "--ranks-on-one-gpu",
                                         "--nproc",
                                         "2"};
  expect_refusal(run_megatune(with_nproc, 60), "without a launcher or --nproc");
}

}  // namespace
}  // namespace megatune::tests
