// `megatune train` with Megatron's FP8 flags on the CPU backend (its emulation of the CUDA casts and GEMMs):
// a run trains and names its recipe, and the inputs FP8 cannot take are refused in one line.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/tools/cli_harness.h"

namespace megatune::tests {
namespace {

const std::vector<std::string> kTiny = {"train", "--model",       "tiny", "--mock-data",    "--device",
                                        "cpu",   "--train-iters", "4",    "--log-interval", "1"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

TEST(CliTrainFp8, TrainsAndNamesTheRecipe) {
  const CliResult r = run_megatune(with(kTiny, {"--bf16", "--fp8-format", "hybrid", "--fp8-amax-history-len",
                                                "4", "--fp8-amax-compute-algo", "max"}),
                                   60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("fp8 hybrid delayed (amax history 4, max, margin 0)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("iteration        4/       4"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("lm loss: nan"), std::string::npos) << r.out;
  const CliResult t =
      run_megatune(with(kTiny, {"--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "tensorwise"}), 60);
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("fp8 e4m3 tensorwise (margin 0)"), std::string::npos) << t.out;
}

TEST(CliTrainFp8, RefusesWhatFp8CannotTake) {
  const CliResult no_bf16 = run_megatune(with(kTiny, {"--fp8-format", "e4m3"}));
  EXPECT_EQ(no_bf16.exit_code, 1);
  EXPECT_EQ(no_bf16.error_lines(), 1) << no_bf16.err;
  EXPECT_NE(no_bf16.err.find("add --bf16"), std::string::npos) << no_bf16.err;

  const CliResult recipe =
      run_megatune(with(kTiny, {"--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"}));
  EXPECT_NE(recipe.exit_code, 0);
  EXPECT_EQ(recipe.error_lines(), 1) << recipe.err;
  EXPECT_NE(recipe.err.find("use delayed"), std::string::npos) << recipe.err;

  // 1 x 24 tokens per micro-batch: FP8 GEMMs need multiples of 16.
  const CliResult shape = run_megatune(
      with(kTiny, {"--bf16", "--fp8-format", "e4m3", "--seq-length", "24", "--micro-batch-size", "1"}));
  EXPECT_EQ(shape.exit_code, 1);
  EXPECT_EQ(shape.error_lines(), 1) << shape.err;
  EXPECT_NE(shape.err.find("multiples of 16"), std::string::npos) << shape.err;

  const CliResult gather =
      run_megatune(with(kTiny, {"--bf16", "--fp8-format", "e4m3", "--fp8-param-gather"}));
  EXPECT_EQ(gather.exit_code, 1);
  EXPECT_EQ(gather.error_lines(), 1) << gather.err;
  EXPECT_NE(gather.err.find("--fp8-param-gather"), std::string::npos) << gather.err;

  for (const char* flag : {"--no-fp8-wgrad", "--fp8-dot-product-attention", "--fp8-multi-head-attention"}) {
    const CliResult refused = run_megatune(with(kTiny, {"--bf16", "--fp8-format", "e4m3", flag}));
    EXPECT_EQ(refused.exit_code, 1) << flag;
    EXPECT_EQ(refused.error_lines(), 1) << refused.err;
    EXPECT_NE(refused.err.find(flag), std::string::npos) << refused.err;
    EXPECT_NE(refused.err.find("drop"), std::string::npos) << refused.err;
  }
}

// Megatron ignores its deprecated --fp8-interval; so does megatune, and says so once.
TEST(CliTrainFp8, TakesTheDeprecatedIntervalAsMegatronDoes) {
  const CliResult r =
      run_megatune(with(kTiny, {"--bf16", "--fp8-format", "hybrid", "--fp8-interval", "1", "--dry-run"}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::size_t line = r.out.find("Megatron flags taken as given");
  ASSERT_NE(line, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--fp8-interval 1", line), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fp8 hybrid delayed"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace megatune::tests
