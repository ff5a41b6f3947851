// plan takes the communication-pricing flags simulate takes: --tp-comm-overlap makes every TP > 1 candidate
// sequence-parallel and hides its collectives, --grad-reduce-in-bf16 halves the gradient reduction, and
// both reach the Megatron-LM command line of the winner.
#include <gtest/gtest.h>

#include <sstream>

#include "cli_harness.h"

namespace megatune::tests {
namespace {

std::vector<std::string> plan_args(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {
      "plan", "--model", "llama3-8b", "--cluster",      "1x8xH100", "--gbs",     "32", "--tp",
      "4",    "--pp",    "1",         "--memory-model", "megatron", "--threads", "2"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The Megatron-LM command line plan prints for its winner.
std::string megatron_line(const std::string& out) {
  const std::size_t at = out.find("Megatron-LM:\n");
  if (at == std::string::npos) return "";
  std::istringstream rest(out.substr(at + 13));
  std::string line;
  std::getline(rest, line);
  return line;
}

// The winner's predicted step time in seconds, from simulate's "step time" line.
double simulated_step_s(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"simulate", "--model", "llama3-8b", "--cluster", "1x8xH100",
                                   "--gbs",    "32",      "--tp",      "4",         "--sequence-parallel"};
  args.insert(args.end(), extra.begin(), extra.end());
  const CliResult r = run_megatune(args, 60);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::size_t at = r.out.find("step time");
  if (at == std::string::npos) return 0;
  return std::stod(r.out.substr(at + 9));
}

TEST(PlanCommFlags, TpCommOverlapMakesTheWinnerSequenceParallelAndReachesMegatron) {
  const CliResult r = run_megatune(plan_args({"--tp-comm-overlap"}), 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string megatron = megatron_line(r.out);
  EXPECT_NE(megatron.find("--sequence-parallel"), std::string::npos) << megatron;
  EXPECT_NE(megatron.find("--tp-comm-overlap"), std::string::npos) << megatron;
  const CliResult plain = run_megatune(plan_args({}), 120);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(megatron_line(plain.out).find("--tp-comm-overlap"), std::string::npos);
}

TEST(PlanCommFlags, GradReduceInBf16ReachesMegatronAndBothFlagsAreRefused) {
  const CliResult r = run_megatune(plan_args({"--grad-reduce-in-bf16"}), 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(megatron_line(r.out).find("--grad-reduce-in-bf16"), std::string::npos);
  const CliResult both =
      run_megatune(plan_args({"--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"}));
  EXPECT_NE(both.exit_code, 0);
  EXPECT_EQ(both.error_lines(), 1) << both.err;
  EXPECT_NE(both.err.find("--grad-reduce-in-bf16"), std::string::npos) << both.err;
}

TEST(PlanCommFlags, SimulatedOverlapAndBf16GradsAreNeverSlower) {
  const double plain = simulated_step_s({});
  ASSERT_GT(plain, 0);
  EXPECT_LT(simulated_step_s({"--tp-comm-overlap"}), plain);
  EXPECT_LE(simulated_step_s({"--grad-reduce-in-bf16"}), plain);
}

}  // namespace
}  // namespace megatune::tests
