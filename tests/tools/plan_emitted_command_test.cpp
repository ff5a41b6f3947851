// The megatune command `plan` writes (<stem>.megatune.args) builds the planned model and layout: run through
// `megatune train --dry-run`, it prints the same model line and settings line as the plan did for its winner,
// for a preset with overrides, a model given by flags alone and an MoE model; the Megatron-LM command carries
// the overrides too.
#include <gtest/gtest.h>

#include "plan_dry_run.h"

namespace megatune::tests {
namespace {

// Plans `model_flags` on one node, runs the emitted megatune command with --dry-run, and compares.
void expect_emitted_command_builds_the_plan(const std::vector<std::string>& model_flags,
                                            const std::vector<std::string>& expected_in_model_line) {
  std::vector<std::string> flags = {"--gbs", "16"};
  flags.insert(flags.end(), model_flags.begin(), model_flags.end());
  const PlanAndDryRun run = plan_then_dry_run(flags);
  ASSERT_EQ(run.planned.exit_code, 0) << run.planned.err;
  const std::string model_line = line_after(run.planned.out, "model: ");
  const std::string settings_line = line_after(run.planned.out, "settings: ");
  ASSERT_FALSE(model_line.empty()) << run.planned.out;
  ASSERT_FALSE(settings_line.empty()) << run.planned.out;
  for (const std::string& part : expected_in_model_line)
    EXPECT_NE(model_line.find(part), std::string::npos) << part << " not in " << model_line;
  ASSERT_EQ(run.dry.exit_code, 0) << run.megatune_args << run.dry.err;
  EXPECT_EQ(line_after(run.dry.out, "model: "), model_line);
  EXPECT_EQ(line_after(run.dry.out, "settings: "), settings_line);

  const std::string& megatron = run.megatron_args;
  for (std::size_t i = 0; i + 1 < model_flags.size(); ++i) {
    const std::string& flag = model_flags[i];
    if (flag == "--num-layers" || flag == "--hidden-size" || flag == "--vocab-size" ||
        flag == "--max-position-embeddings" || flag == "--seq-length") {
      EXPECT_NE(megatron.find(flag + " " + model_flags[i + 1]), std::string::npos) << megatron;
    }
  }
}

TEST(PlanEmittedCommand, APresetWithOverridesTrainsThePlannedModel) {
  expect_emitted_command_builds_the_plan(
      {"--model", "gpt-125m", "--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8",
       "--vocab-size", "1000", "--seq-length", "1024", "--max-position-embeddings", "4096"},
      {"gpt-125m: 4 layers, hidden 256", "heads 8", "positions 4096", "vocab 1000"});
}

TEST(PlanEmittedCommand, AModelGivenByFlagsAloneTrainsThePlannedModel) {
  expect_emitted_command_builds_the_plan(
      {"--num-layers",
       "4",
       "--hidden-size",
       "256",
       "--num-attention-heads",
       "8",
       "--num-query-groups",
       "2",
       "--group-query-attention",
       "--ffn-hidden-size",
       "768",
       "--swiglu",
       "--normalization",
       "RMSNorm",
       "--position-embedding-type",
       "rope",
       "--disable-bias-linear",
       "--untie-embeddings-and-output-weights",
       "--vocab-size",
       "512",
       "--seq-length",
       "512"},
      {"custom: 4 layers", "query groups 2", "ffn 768", "RMSNorm", "rope", "untied", "no biases"});
}

TEST(PlanEmittedCommand, APresetMoeWithOverridesTrainsThePlannedModel) {
  expect_emitted_command_builds_the_plan({"--model", "tiny-mixtral", "--num-layers", "4", "--num-experts",
                                          "4", "--moe-layer-freq", "([0]*1+[1]*3)", "--seq-length", "256"},
                                         {"tiny-mixtral: 4 layers", "4 experts", "MoE layers 0111"});
}

}  // namespace
}  // namespace megatune::tests
