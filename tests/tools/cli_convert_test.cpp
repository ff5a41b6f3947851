// `megatune convert` as a user runs it: a trained tp2 checkpoint exported to HF and imported again resumes
// with `train --load` and no model flags, at the loss the original resumes at; outputs that hold data are
// never overwritten without --overwrite; bad flag combinations and bad folders are one error line.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/tools/cli_harness.h"

namespace megatune::tests {
namespace {

namespace fs = std::filesystem;

// One line on stderr holding `text`, a non-zero exit, no crash.
void expect_refusal(const CliResult& r, const std::string& text) {
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.error_lines(), 1) << r.err;
  EXPECT_NE(r.err.find(text), std::string::npos) << r.err;
}

std::vector<std::string> train(std::vector<std::string> extra) {
  std::vector<std::string> args = {"train", "--device",       "cpu", "--mock-data",  "--gbs", "4", "--mbs",
                                   "2",     "--log-interval", "1",   "--eval-iters", "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The final validation loss of a run's output.
std::string validation_loss(const std::string& out) {
  const std::string key = "on validation set | lm loss value: ";
  const size_t at = out.find(key);
  return at == std::string::npos ? "(none)" : out.substr(at + key.size(), 12);
}

TEST(CliConvert, ExportedAndImportedCheckpointResumesWithoutModelFlags) {
  const TempDir dir;
  const std::string trained = dir / "trained", hf = dir / "hf", imported = dir / "imported";
  const CliResult t = run_megatune(train({"--model", "tiny", "--nproc", "2", "--tp", "2", "--train-iters",
                                          "3", "--lr", "1e-3", "--save", trained}),
                                   120);
  ASSERT_EQ(t.exit_code, 0) << t.err;
  const CliResult exported = run_megatune({"convert", "--to-hf", hf, "--load", trained}, 60);
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_TRUE(fs::exists(hf + "/config.json"));
  EXPECT_TRUE(fs::exists(hf + "/model.safetensors"));
  EXPECT_NE(read_text(hf + "/config.json").find("LlamaForCausalLM"), std::string::npos);
  const CliResult in = run_megatune({"convert", "--from-hf", hf, "--save", imported}, 60);
  ASSERT_EQ(in.exit_code, 0) << in.err;
  // The original resumed at tp1 (no step: it is at iteration 3) and the import after a step at lr 0.
  const CliResult original =
      run_megatune(train({"--load", trained, "--train-iters", "3", "--lr", "1e-3"}), 120);
  ASSERT_EQ(original.exit_code, 0) << original.err;
  const CliResult converted =
      run_megatune(train({"--load", imported, "--train-iters", "1", "--lr", "0"}), 120);
  ASSERT_EQ(converted.exit_code, 0) << converted.err;
  EXPECT_NE(validation_loss(original.out), "(none)") << original.out;
  EXPECT_EQ(validation_loss(converted.out), validation_loss(original.out)) << converted.out;
}

TEST(CliConvert, NeverOverwritesAFolderThatHoldsData) {
  const TempDir dir;
  const std::string trained = dir / "trained", hf = dir / "hf";
  ASSERT_EQ(
      run_megatune(train({"--model", "tiny", "--train-iters", "1", "--lr", "1e-3", "--save", trained}), 120)
          .exit_code,
      0);
  fs::create_directories(hf);
  write_text(hf + "/notes.txt", "keep me");
  expect_refusal(run_megatune({"convert", "--to-hf", hf, "--load", trained}), "--overwrite");
  EXPECT_EQ(read_text(hf + "/notes.txt"), "keep me");
  EXPECT_EQ(run_megatune({"convert", "--to-hf", hf, "--load", trained, "--overwrite"}).exit_code, 0);
  EXPECT_FALSE(fs::exists(hf + "/notes.txt"));
  expect_refusal(run_megatune({"convert", "--from-hf", hf, "--save", trained}), "--overwrite");
  EXPECT_TRUE(fs::exists(trained + "/latest_checkpointed_iteration.txt"));
}

TEST(CliConvert, RefusesBadFlagsAndFoldersInOneLine) {
  const TempDir dir;
  expect_refusal(run_megatune({"convert", "--save", dir / "c"}), "exactly one of");
  expect_refusal(run_megatune({"convert", "--from-hf", dir.path()}), "--save");
  expect_refusal(run_megatune({"convert", "--from-hf", dir.path(), "--save", dir / "c"}), "config.json");
  fs::create_directories(dir / "hf");
  write_text(dir / "hf/config.json", R"({"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2,
      "n_positions": 8, "vocab_size": 16})");
  write_text(dir / "hf/model.safetensors", "truncated");
  expect_refusal(run_megatune({"convert", "--from-hf", dir / "hf", "--save", dir / "c"}),
                 "model.safetensors");
  expect_refusal(run_megatune({"convert", "--from-hf", dir / "hf", "--save", dir / "c", "--num-layers", "2"}),
                 "config.json");
  expect_refusal(run_megatune({"convert", "--to-hf", dir / "out", "--load", dir / "missing"}), "missing");
  expect_refusal(
      run_megatune({"convert", "--to-hf", dir / "out", "--load", dir / "x", "--max-shard-size", "5XB"}),
      "--max-shard-size");
}

}  // namespace
}  // namespace megatune::tests
