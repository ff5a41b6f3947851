// plan --against: the user's layout, parsed with plan's Megatron flags, priced as `megatune simulate` prices
// it and set beside the pick (both columns, where the step goes, the faster one); bad flags get one line.
#include "tools/plan_against.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/user_error.h"
#include "cli_harness.h"

namespace megatune::tests {
namespace {

const std::vector<std::string> kPlan = {"plan",     "--model", "llama3-8b", "--cluster", "1x8xH100",
                                        "--gbs",    "64",      "--threads", "2",         "--memory-model",
                                        "megatron", "--top-k", "3"};

CliResult plan_against(const std::string& flags) {
  std::vector<std::string> args = kPlan;
  args.push_back("--against");
  args.push_back(flags);
  return run_megatune(args, 60);
}

// The rest of the line after `label` and its padding (labels end with two or more spaces), e.g. "step time".
std::string row(const std::string& out, const std::string& label) {
  const std::size_t at = out.find(label + "  ");
  if (at == std::string::npos) return "";
  const std::size_t end = out.find('\n', at);
  return out.substr(at + label.size(), end - at - label.size());
}

double first_seconds(const std::string& text) {
  const std::size_t at = text.find_first_of("0123456789");
  return at == std::string::npos ? -1.0 : std::stod(text.substr(at));
}

TEST(PlanAgainst, SetsTheUsersLayoutBesideThePickPricedAsSimulatePricesIt) {
  const std::string flags =
      "--tp 2 --pp 2 --sequence-parallel --pipeline-model-parallel-layout 'Et*15|t*17L'";
  const CliResult r = plan_against(flags);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("against your layout (--against"), std::string::npos) << r.out;
  EXPECT_NE(row(r.out, "pipeline layout").find("Et*15|t*17L"), std::string::npos) << r.out;
  for (const char* term :
       {"compute (incl. recomputation)", "TP communication exposed", "CP communication exposed",
        "EP communication exposed", "PP communication exposed", "DP communication exposed",
        "pipeline bubble and waiting", "MFU", "memory (peak pp rank)", "bubble (mean over stages)"})
    EXPECT_FALSE(row(r.out, term).empty()) << term << "\n" << r.out;
  EXPECT_GT(first_seconds(row(r.out, "TP communication exposed")), 0.0);
  // The same flags through `megatune simulate`: the same step time.
  const CliResult simulated =
      run_megatune({"simulate", "--model", "llama3-8b", "--cluster", "1x8xH100", "--gbs", "64", "--tp", "2",
                    "--pp", "2", "--sequence-parallel", "--pipeline-model-parallel-layout", "Et*15|t*17L"},
                   60);
  ASSERT_EQ(simulated.exit_code, 0) << simulated.err;
  EXPECT_NEAR(first_seconds(row(r.out, "step time")), first_seconds(row(simulated.out, "step time")), 1e-3);
  // A two-way pipeline of 16 microbatches loses to the pick, mostly to its bubble or its TP collectives.
  EXPECT_NE(r.out.find("the plan's pick is "), std::string::npos) << r.out;
}

TEST(PlanAgainst, FlagsPlanWouldNotTakeAreRefusedInOneLineNamingAgainst) {
  for (const std::string& bad : {std::string("--num-layers 4"), std::string("--tp 3"),
                                 std::string("--tp 2 --pp '2"), std::string("--gbs 99"), std::string(""),
                                 std::string("--tp"), std::string("--recompute-num-layers 2")}) {
    const CliResult r = plan_against(bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_EQ(r.error_lines(), 1) << bad << ": " << r.err;
    EXPECT_NE(r.err.find("--against"), std::string::npos) << bad << ": " << r.err;
    EXPECT_EQ(r.out.find("search:"), std::string::npos) << "searched before refusing " << bad;
  }
}

TEST(PlanAgainst, SplitsItsFlagsAsAShellWould) {
  using tools::split_flag_string;
  EXPECT_EQ(split_flag_string("  --tp 2   --pp\t4 ", "--against"),
            (std::vector<std::string>{"--tp", "2", "--pp", "4"}));
  EXPECT_EQ(split_flag_string("--pipeline-model-parallel-layout 'E|(t|)*4L' --x \"a b\" c\\ d", "--against"),
            (std::vector<std::string>{"--pipeline-model-parallel-layout", "E|(t|)*4L", "--x", "a b", "c d"}));
  EXPECT_EQ(split_flag_string("--x ''", "--against"), (std::vector<std::string>{"--x", ""}));
  EXPECT_THROW(split_flag_string("--x 'open", "--against"), UserError);
}

}  // namespace
}  // namespace megatune::tests
