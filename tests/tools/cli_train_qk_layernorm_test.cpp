// `megatune train --qk-layernorm` (the norm of each query and key head before RoPE) on the CPU backend: the
// tiny Llama-style preset learns byte-level text with it, alone and under TP 2 (the head norms' weights are
// replicated, their gradients summed over TP); a run through a checkpoint resumes exactly and the checkpoint
// holds the head norms under Megatron's names; the dry run names the flag and sizes the saved norm inputs.
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

std::vector<double> losses(const std::string& out) { return logged_values(out, "lm loss"); }

CliResult train(const std::string& data, const std::vector<std::string>& more,
                const std::string& iterations = "40") {
  std::vector<std::string> args = {"train",         "--model",  "tiny",           "--qk-layernorm",
                                   "--device",      "cpu",      "--data-path",    data,
                                   "--split",       "1,0,0",    "--gbs",          "8",
                                   "--mbs",         "2",        "--lr",           "3e-3",
                                   "--train-iters", iterations, "--log-interval", "10"};
  args.insert(args.end(), more.begin(), more.end());
  return run_megatune(args, 180);
}

void expect_learns(const CliResult& r) {
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<double> loss = losses(r.out);
  ASSERT_EQ(loss.size(), 4u) << r.out;
  EXPECT_GT(loss.front(), 4.0) << r.out;
  EXPECT_LT(loss.back(), loss.front() - 1.0) << r.out;
}

TEST(CliTrainQkLayernorm, TinyLearnsText) {
  TempDir dir;
  expect_learns(train(make_corpus(dir), {}));
}

TEST(CliTrainQkLayernorm, TinyLearnsTextUnderTensorParallelism) {
  TempDir dir;
  const std::string data = make_corpus(dir);
  const CliResult single = train(data, {});
  const CliResult tp2 = train(data, {"--tp", "2", "--nproc", "2"});
  expect_learns(tp2);
  const std::vector<double> a = losses(single.out), b = losses(tp2.out);
  ASSERT_EQ(a.size(), b.size()) << single.out << tp2.out;
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-3 * a[i]) << i;
}

TEST(CliTrainQkLayernorm, ResumesExactlyFromItsCheckpoint) {
  // 20 iterations at once, and 10 + 10 through a checkpoint: the same loss at iteration 20 only if the head
  // norms' weights (and their optimizer state) were saved and loaded.
  TempDir dir;
  const std::string data = make_corpus(dir);
  const std::vector<std::string> decay = {"--lr-decay-iters", "20"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), decay.begin(), decay.end());
    return more;
  };
  const CliResult whole = train(data, with({}), "20");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const CliResult first = train(data, with({"--save", dir / "ckpt"}), "10");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::string manifest = read_text(dir / "ckpt/iter_0000010/mp_rank_00/manifest.txt");
  for (const char* name : {"decoder.layers.0.self_attention.q_layernorm.weight",
                           "decoder.layers.1.self_attention.k_layernorm.weight"})
    EXPECT_NE(manifest.find(name), std::string::npos) << name;
  const CliResult resumed = train(data, with({"--load", dir / "ckpt", "--save", dir / "ckpt2"}), "20");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const std::vector<double> a = losses(whole.out), b = losses(resumed.out);
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(a.back(), b.back()) << whole.out << resumed.out;
  // The model without the flag is another model: refused, naming both; without model flags the run takes
  // the checkpoint's, --qk-layernorm included.
  const std::vector<std::string> resume = {"train",   "--device",      "cpu",   "--data-path", data,
                                           "--split", "1,0,0",         "--gbs", "8",           "--mbs",
                                           "2",       "--train-iters", "12",    "--load",      dir / "ckpt"};
  std::vector<std::string> plain = resume;
  plain.insert(plain.end(), {"--model", "tiny"});
  const CliResult refused = run_megatune(plain, 120);
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  EXPECT_EQ(refused.error_lines(), 1) << refused.err;
  EXPECT_NE(refused.err.find("qk-norm but this run has model_config"), std::string::npos) << refused.err;
  const CliResult adopted = run_megatune(resume, 120);
  ASSERT_EQ(adopted.exit_code, 0) << adopted.err;
  EXPECT_NE(adopted.out.find("no-bias qk-norm)"), std::string::npos) << adopted.out;
}

TEST(CliTrainQkLayernorm, DryRunNamesItAndSizesTheNormInputs) {
  const CliResult r = run_megatune({"train", "--model", "tiny", "--qk-layernorm", "--device", "cpu",
                                    "--mock-data", "--gbs", "4", "--mbs", "2", "--dry-run"},
                                   60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("qk-layernorm"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("saved: qk head norm inputs and statistics"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace megatune::tests
