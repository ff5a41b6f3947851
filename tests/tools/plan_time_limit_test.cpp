// plan --time-limit returns the best plan found so far and says so in one line; --progress shows the search
// (its bounding and simulating phases) as log lines when stderr is not a terminal, and nothing without it.
#include <gtest/gtest.h>

#include "cli_harness.h"

namespace megatune::tests {
namespace {

std::vector<std::string> plan_args(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"plan",     "--model", "llama3-8b", "--cluster", "2x8xH100",
                                   "--gbs",    "64",      "--threads", "2",         "--memory-model",
                                   "megatron", "--top-k", "3"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(PlanTimeLimit, ALimitReachedReturnsTheBestFoundSoFarSayingSoOnce) {
  // A limit shorter than any search: the plan is the first candidate simulated that fits.
  const CliResult r = run_megatune(plan_args({"--time-limit", "0.000001"}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.out, "time limit: stopped after"), 1) << r.out;
  EXPECT_NE(r.out.find("not reached (raise --time-limit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("winner: "), std::string::npos);
  EXPECT_NE(r.out.find("megatune train:"), std::string::npos);
  const CliResult unlimited = run_megatune(plan_args({}), 60);
  ASSERT_EQ(unlimited.exit_code, 0) << unlimited.err;
  EXPECT_EQ(unlimited.out.find("time limit"), std::string::npos);
}

TEST(PlanTimeLimit, ALimitThatIsNotAPositiveNumberIsRefusedInOneLine) {
  for (const char* bad : {"0", "-3", "soon"}) {
    const CliResult r = run_megatune(plan_args({"--time-limit", bad}), 60);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_EQ(r.error_lines(), 1) << r.err;
    EXPECT_NE(r.err.find("--time-limit"), std::string::npos) << r.err;
  }
}

TEST(PlanProgress, ProgressNamesBothPhasesAndIsOffWithoutTheFlagOffATerminal) {
  const CliResult r = run_megatune(plan_args({"--progress"}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("searching ["), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bounding"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("simulating, best "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("100%"), std::string::npos) << r.err;
  const CliResult quiet = run_megatune(plan_args({}), 60);
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("searching"), std::string::npos) << quiet.err;
}

}  // namespace
}  // namespace megatune::tests
