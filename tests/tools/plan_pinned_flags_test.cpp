// Every Megatron flag `plan` takes either pins the search and reaches both emitted commands (checked through
// `train --dry-run`: the settings line of the emitted megatune command equals the plan's), or is refused
// with one line naming it: --dp, the split flags, --recompute-method / --recompute-num-layers, the MoE
// dispatcher, the microbatch group size and --use-tp-pp-dp-mapping.
#include <gtest/gtest.h>

#include "plan_dry_run.h"

namespace megatune::tests {
namespace {

const std::vector<std::string> kDense = {"--model",      "llama3-1b", "--num-layers", "32",
                                         "--seq-length", "2048",      "--gbs",        "32"};

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& extra) {
  base.insert(base.end(), extra.begin(), extra.end());
  return base;
}

// Plans with `flags`, expects the settings line to hold each of `settings` and both argument files each of
// `emitted`, and the emitted megatune command to describe the same settings.
void expect_pinned(const std::vector<std::string>& flags, const std::vector<std::string>& settings,
                   const std::vector<std::string>& emitted) {
  const PlanAndDryRun run = plan_then_dry_run(flags);
  ASSERT_EQ(run.planned.exit_code, 0) << run.planned.err;
  const std::string line = line_after(run.planned.out, "settings: ");
  for (const std::string& part : settings)
    EXPECT_NE(line.find(part), std::string::npos) << part << " / " << line;
  for (const std::string& flag : emitted) {
    EXPECT_NE(run.megatune_args.find(flag), std::string::npos) << flag << " / " << run.megatune_args;
    EXPECT_NE(run.megatron_args.find(flag), std::string::npos) << flag << " / " << run.megatron_args;
  }
  ASSERT_EQ(run.dry.exit_code, 0) << run.megatune_args << run.dry.err;
  EXPECT_EQ(line_after(run.dry.out, "settings: "), line);
}

void expect_refused(const std::vector<std::string>& flags, const std::string& named) {
  std::vector<std::string> args = with({"plan", "--cluster", "1x8xH100"}, flags);
  const CliResult r = run_megatune(args, 60);
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.error_lines(), 1) << r.err;
  EXPECT_NE(r.err.find(named), std::string::npos) << r.err;
}

TEST(PlanPinnedFlags, DataParallelSizeFixesTheWinnersDp) {
  expect_pinned(with(kDense, {"--dp", "2"}), {" dp2 "}, {"--global-batch-size 32"});
  expect_refused(with(kDense, {"--dp", "3"}), "--data-parallel-size 3");
}

TEST(PlanPinnedFlags, UnevenFirstAndLastStagesReachBothCommands) {
  expect_pinned(with(kDense, {"--decoder-first-pipeline-num-layers", "6",
                              "--decoder-last-pipeline-num-layers", "6", "--use-tp-pp-dp-mapping"}),
                {"pp4", "layout Et*6|t*10|t*10|t*6L", "rank order tp-cp-ep-pp-dp"},
                {"--decoder-first-pipeline-num-layers 6", "--decoder-last-pipeline-num-layers 6",
                 "--use-tp-pp-dp-mapping"});
  expect_refused(with(kDense, {"--decoder-first-pipeline-num-layers", "6", "--pipeline-model-parallel-layout",
                               "Et*16|t*16L"}),
                 "--pipeline-model-parallel-layout");
}

TEST(PlanPinnedFlags, EmbeddingAndLossAccountingReachBothCommands) {
  expect_pinned({"--model", "llama3-1b", "--num-layers", "30", "--seq-length", "2048", "--gbs", "32", "--pp",
                 "4", "--no-virtual-pipeline", "--account-for-embedding-in-pipeline-split",
                 "--account-for-loss-in-pipeline-split"},
                {"layout Et*7|t*8|t*8|t*7L"},
                {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"});
}

TEST(PlanPinnedFlags, MicrobatchGroupSizeReachesTheInterleavedWinner) {
  expect_pinned(with(kDense, {"--pp", "4", "--num-virtual-stages-per-pipeline-rank", "2",
                              "--microbatch-group-size-per-virtual-pipeline-stage", "8"}),
                {"vpp2", "microbatch group 8"}, {"--microbatch-group-size-per-virtual-pipeline-stage 8"});
}

TEST(PlanPinnedFlags, RecomputeMethodAndLayersPinFullRecomputationAndReachBothCommands) {
  expect_pinned(with(kDense, {"--recompute-method", "uniform", "--recompute-num-layers", "1"}),
                {"recompute full (uniform, 1 layer per unit)"},
                {"--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"});
  expect_pinned(with(kDense, {"--recompute-granularity", "full", "--recompute-method", "uniform",
                              "--recompute-num-layers", "2"}),
                {"recompute full (uniform, 2 layers per unit)"},
                {"--recompute-method uniform", "--recompute-num-layers 2"});
  expect_pinned(with(kDense, {"--recompute-method", "block", "--recompute-num-layers", "2"}),
                {"recompute full (block, 2 layers per chunk)"},
                {"--recompute-granularity full", "--recompute-method block", "--recompute-num-layers 2"});
  // Full recomputation given alone: block units are searched beside uniform 1 and, recomputing less, win.
  expect_pinned(with(kDense, {"--recompute-granularity", "full"}), {"recompute full (block, "},
                {"--recompute-granularity full", "--recompute-method block", "--recompute-num-layers "});
  expect_refused(with(kDense, {"--recompute-num-layers", "2"}),
                 "--recompute-num-layers 2 needs --recompute-method");
  expect_refused(with(kDense, {"--recompute-num-layers", "0"}), "--recompute-num-layers");
  expect_refused(with(kDense, {"--recompute-granularity", "selective", "--recompute-method", "uniform"}),
                 "--recompute-granularity full");
}

TEST(PlanPinnedFlags, AllgatherDispatcherReachesBothCommands) {
  expect_pinned({"--model", "tiny-mixtral", "--seq-length", "256", "--gbs", "16", "--tp", "2", "--ep", "4",
                 "--moe-token-dispatcher-type", "allgather"},
                {"dispatcher allgather"}, {"--moe-token-dispatcher-type allgather"});
  expect_refused({"--model", "tiny-mixtral", "--gbs", "16", "--moe-token-dispatcher-type", "bogus"},
                 "--moe-token-dispatcher-type");
}

}  // namespace
}  // namespace megatune::tests
