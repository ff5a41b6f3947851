// `megatune train` of the tiny MoE presets on the CPU backend: tiny-mixtral (softmax top-2, aux loss) and
// tiny-deepseek-v3 (sigmoid routing, sequence aux loss, shared expert, a first dense layer) and
// tiny-deepseek-v3-full (also MLA and multi-token prediction) learn byte-level text (falling loss),
// tiny-mixtral also under TP 2 with its default expert TP 2, and log Megatron's load_balancing_loss; bad MoE
// flags fail with one line.
#include <gtest/gtest.h>

#include <regex>

#include "tests/tools/cli_harness.h"

namespace megatune::tests {
namespace {

std::string make_corpus(const TempDir& dir) {
  const std::string prefix = frozen_text_corpus(dir);
  EXPECT_FALSE(prefix.empty()) << "data preprocess failed";
  return prefix;
}

CliResult train(const std::string& model, const std::string& data, const std::vector<std::string>& more,
                const std::string& iterations = "40") {
  std::vector<std::string> args = {"train", "--model", model,   "--device",      "cpu",      "--data-path",
                                   data,    "--split", "1,0,0", "--train-iters", iterations, "--gbs",
                                   "8",     "--mbs",   "2",     "--lr",          "3e-3",     "--log-interval",
                                   "10"};
  args.insert(args.end(), more.begin(), more.end());
  return run_megatune(args, 120);
}

void expect_learns(const CliResult& r) {
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<double> loss = logged_values(r.out, "lm loss"),
                            balance = logged_values(r.out, "load_balancing_loss");
  ASSERT_EQ(loss.size(), 4u) << r.out;
  EXPECT_GT(loss.front(), 4.0) << r.out;
  EXPECT_LT(loss.back(), loss.front() - 1.0) << r.out;
  ASSERT_EQ(balance.size(), 4u) << r.out;
  for (double b : balance) {  // 1 for perfectly balanced routing, at most E / k
    EXPECT_GT(b, 0.9) << r.out;
    EXPECT_LT(b, 2.0) << r.out;
  }
}

TEST(CliTrainMoe, TinyMixtralLearnsText) {
  TempDir dir;
  const std::string data = make_corpus(dir);
  expect_learns(train("tiny-mixtral", data, {"--moe-aux-loss-coeff", "1e-2"}));
}

// Megatron's default expert-tensor-parallel size is the TP size: here each expert is split over the TP pair.
TEST(CliTrainMoe, TinyMixtralLearnsTextWithExpertTensorParallelism) {
  TempDir dir;
  const std::string data = make_corpus(dir);
  expect_learns(train("tiny-mixtral", data,
                      {"--moe-aux-loss-coeff", "1e-2", "--tp", "2", "--sequence-parallel", "--nproc", "2"}));
}

TEST(CliTrainMoe, TinyDeepSeekV3ShapeLearnsTextWithSigmoidRouting) {
  TempDir dir;
  const std::string data = make_corpus(dir);
  expect_learns(
      train("tiny-deepseek-v3", data,
            {"--moe-router-score-function", "sigmoid", "--moe-router-load-balancing-type", "seq_aux_loss",
             "--moe-aux-loss-coeff", "1e-3", "--moe-expert-capacity-factor", "1.5"}));
}

// DeepSeek-V3 scaled down, every feature at once: MLA, MoE with sigmoid scores and the expert bias, a shared
// expert after a first dense layer, and multi-token prediction, whose loss falls beside the model's.
TEST(CliTrainMoe, TinyDeepSeekV3FullLearnsTextWithMtp) {
  TempDir dir;
  const std::string data = make_corpus(dir);
  const CliResult r =
      train("tiny-deepseek-v3-full", data,
            {"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
             "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-3"});
  expect_learns(r);
  const std::vector<double> mtp = logged_values(r.out, "mtp_1 loss");
  ASSERT_EQ(mtp.size(), 4u) << r.out;
  EXPECT_LT(mtp.back(), mtp.front() - 1.0) << r.out;
}

TEST(CliTrainMoe, ExpertBiasResumesFromItsCheckpoint) {
  // 20 iterations at once, and 10 + 10 through a checkpoint: the same loss at iteration 20 only if the
  // routers' expert biases were saved and loaded with the weights.
  TempDir dir;
  const std::string data = make_corpus(dir);
  const std::vector<std::string> flags = {"--moe-router-score-function",
                                          "sigmoid",
                                          "--moe-router-enable-expert-bias",
                                          "--moe-router-bias-update-rate",
                                          "0.05",
                                          "--lr-decay-iters",
                                          "20"};
  auto run = [&](const std::string& iterations, std::vector<std::string> more) {
    std::vector<std::string> args = flags;
    args.insert(args.end(), more.begin(), more.end());
    return train("tiny-deepseek-v3", data, args, iterations);
  };
  const CliResult whole = run("20", {});
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const CliResult first = run("10", {"--save", dir / "ckpt"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const CliResult resumed = run("20", {"--load", dir / "ckpt", "--save", dir / "ckpt2"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const std::vector<double> a = logged_values(whole.out, "lm loss"),
                            b = logged_values(resumed.out, "lm loss");
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(a.back(), b.back()) << whole.out << resumed.out;
}

TEST(CliTrainMoe, BadMoeFlagsFailWithOneLine) {
  const std::vector<std::string> base = {"train", "--model",     "tiny-mixtral",  "--device",
                                         "cpu",   "--mock-data", "--gbs",         "4",
                                         "--mbs", "2",           "--train-iters", "2"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = base;
    args.insert(args.end(), more.begin(), more.end());
    return run_megatune(args, 60);
  };
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--moe-router-score-function", "tanh"}, "--moe-router-score-function"},
      {{"--moe-router-load-balancing-type", "sinkhorn"}, "--moe-router-load-balancing-type"},
      {{"--moe-expert-capacity-factor", "-1"}, "--moe-expert-capacity-factor"},
      {{"--moe-aux-loss-coeff", "-0.1"}, "--moe-aux-loss-coeff"},
      {{"--moe-router-topk", "9"}, "--moe-router-topk"},
      {{"--tp", "2", "--nproc", "2"}, "need --sequence-parallel"},
      // The expert grid etp x ep x pp must tile the world.
      {{"--expert-tensor-parallel-size", "2"}, "etp x ep x pp"},
      {{"--moe-token-dispatcher-type", "flex"}, "--moe-token-dispatcher-type"},
      {{"--moe-token-dispatcher-type", "all2all"}, "use alltoall or allgather"},
      {{"--moe-router-enable-expert-bias"}, "--moe-router-score-function sigmoid"},
  };
  for (const auto& [flags, mention] : cases) {
    const CliResult r = with(flags);
    EXPECT_EQ(r.exit_code, 1) << flags[0] << ": " << r.err;
    EXPECT_EQ(r.error_lines(), 1) << r.err;
    EXPECT_NE(r.err.find(mention), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace megatune::tests
