// CPU training of the `tiny` preset through TrainingRun: the loss falls on mock data, a resumed run
// reproduces the uninterrupted loss trajectory exactly, and the log lines follow Megatron's format.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "base/user_error.h"
#include "executor/cpu/cpu_backend.h"
#include "executor/data/preprocess.h"
#include "executor/parallel/communicator.h"
#include "executor/training/training_run.h"
#include "layouts/model_spec.h"

namespace megatune::executor {
namespace {

RunConfig tiny_run(std::int64_t train_iters) {
  const layouts::ModelSpec spec = layouts::model_preset("tiny");
  RunConfig run;
  run.trainer.model = transformer_config_from(spec, 1, 10000.0f, 1e-5f, 0.02f);
  run.trainer.batch.micro_batch = 2;
  run.trainer.batch.seq = spec.seq_length;
  run.trainer.batch.num_microbatches = 2;
  run.trainer.compute_dtype = DType::kBF16;
  run.trainer.lr.max_lr = 3e-3;
  run.trainer.lr.min_lr = 3e-4;
  run.trainer.lr.style = LrDecayStyle::kCosine;
  run.trainer.lr.warmup_samples = 4 * run.trainer.global_batch_size();
  run.trainer.lr.decay_samples = 60 * run.trainer.global_batch_size();
  run.train_iters = train_iters;
  run.data.mock_data = true;
  run.data.gpt.vocab_size = spec.vocab_size;
  run.data.gpt.eod_token = 0;
  run.data.mock.vocab_size = spec.vocab_size;
  run.data.mock.max_sequence_length = 200;
  run.data.mock.num_sequences = 2000;
  run.log_interval = 5;
  return run;
}

std::vector<IterationRecord> train(RunConfig config, std::string* log_text = nullptr) {
  CpuBackend backend(/*emulate_bf16=*/true);
  SingleRankCommunicator communicator(backend);
  std::ostringstream log;
  TrainingRun run(std::move(config), backend, communicator, log);
  std::vector<IterationRecord> records = run.run();
  if (log_text) *log_text = log.str();
  return records;
}

TEST(TrainTiny, LossFallsOnMockData) {
  std::string log;
  const std::vector<IterationRecord> records = train(tiny_run(40), &log);
  ASSERT_EQ(records.size(), 40u);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += records[i].step.loss / 5;
  for (int i = 35; i < 40; ++i) last += records[i].step.loss / 5;
  EXPECT_NEAR(first, std::log(256.0), 0.3);  // starts near uniform over the vocabulary
  EXPECT_LT(last, first - 1.5) << log;
  for (const IterationRecord& r : records) {
    EXPECT_FALSE(r.step.skipped);
    EXPECT_TRUE(std::isfinite(r.step.grad_norm));
  }
  EXPECT_NE(log.find("iteration       40/      40 | consumed samples:          160 |"), std::string::npos)
      << log;
  EXPECT_NE(log.find("| global batch size:     4 | lm loss: "), std::string::npos) << log;
  EXPECT_NE(log.find("| number of skipped iterations:   0 |"), std::string::npos) << log;
}

// Real text: this repository's engine sources, byte-tokenized into Megatron's .bin/.idx under dir; returns
// the dataset's path prefix.
std::string byte_level_corpus(const std::filesystem::path& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // A frozen snapshot of four of the executor's source files (80 KB of C++): the curves the tests hold
  // against each other must not move when those files are edited.
  data::PreprocessConfig pre;
  pre.input_path = std::string(MEGATUNE_SOURCE_DIR) + "/tests/executor/data/byte_level_corpus.txt";
  pre.output_prefix = (dir / "corpus").string();
  const data::PreprocessResult result = data::preprocess_data(pre);
  if (result.outputs.size() != 1 || result.outputs[0].tokens < 20000)
    throw std::runtime_error("the byte-level corpus is missing or too small");
  return result.outputs[0].path_prefix;
}

TEST(TrainTiny, LossFallsOnByteLevelTextFromAnIndexedDataset) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "megatune_train_text";
  RunConfig run = tiny_run(50);
  run.data.mock_data = false;
  run.data.data_path = {byte_level_corpus(dir)};
  run.data.split = "1,0,0";
  const std::vector<IterationRecord> records = train(run);
  ASSERT_EQ(records.size(), 50u);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += records[i].step.loss / 5;
  for (int i = 45; i < 50; ++i) last += records[i].step.loss / 5;
  EXPECT_GT(first, 5.0);
  EXPECT_LT(last, 3.6);  // bytes of source code: well below log(256) = 5.55 after 50 small steps
  std::filesystem::remove_all(dir);
}

// FP8 linears (the CPU backend's emulation of the CUDA casts and GEMMs) on real text: after warm-up, each
// logged point (the mean loss of 5 iterations, as Megatron's log line averages its interval) stays within
// 1.5% of the bf16 run's, for the delayed (hybrid, amax history 16, max) and tensorwise (E4M3) recipes.
TEST(TrainTiny, Fp8LossFollowsTheBf16CurveOnText) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "megatune_train_text_fp8";
  const std::string corpus = byte_level_corpus(dir);
  auto run_with = [&](const layouts::Fp8Settings& fp8) {
    RunConfig run = tiny_run(60);
    run.data.mock_data = false;
    run.data.data_path = {corpus};
    run.data.split = "1,0,0";
    run.trainer.model.fp8 = fp8;
    return train(run);
  };
  const std::vector<IterationRecord> bf16 = run_with({});
  layouts::Fp8Settings delayed;
  delayed.format = layouts::Fp8Format::kHybrid;
  delayed.amax_history_len = 16;
  delayed.amax_max = true;
  layouts::Fp8Settings tensorwise;
  tensorwise.format = layouts::Fp8Format::kE4M3;
  tensorwise.recipe = layouts::Fp8Recipe::kTensorwise;
  for (const layouts::Fp8Settings& fp8 : {delayed, tensorwise}) {
    const std::vector<IterationRecord> run = run_with(fp8);
    ASSERT_EQ(run.size(), bf16.size());
    bool differs = false;
    for (std::size_t end = 15; end <= run.size(); end += 5) {
      double a = 0, b = 0;
      for (std::size_t i = end - 5; i < end; ++i) {
        a += run[i].step.loss / 5;
        b += bf16[i].step.loss / 5;
        differs = differs || run[i].step.loss != bf16[i].step.loss;
      }
      EXPECT_NEAR(a / b, 1.0, 0.015) << layouts::fp8_recipe_name(fp8.recipe) << " at iteration " << end;
    }
    EXPECT_TRUE(differs) << "the FP8 run should not be the bf16 run";
  }
  std::filesystem::remove_all(dir);
}

// --mtp-num-layers 1 on the tiny preset: the main and the MTP loss fall, and the log line carries Megatron's
// "mtp_1 loss" after the lm loss.
TEST(TrainTiny, MultiTokenPredictionLossesFall) {
  RunConfig run = tiny_run(30);
  layouts::ModelSpec spec = layouts::model_preset("tiny");
  spec.mtp_num_layers = 1;
  run.trainer.model = transformer_config_from(spec, 1, 10000.0f, 1e-5f, 0.02f);
  run.trainer.model.mtp_loss_scaling_factor = 0.3f;
  std::string log;
  const std::vector<IterationRecord> records = train(run, &log);
  ASSERT_EQ(records.size(), 30u);
  double first = 0, last = 0, first_mtp = 0, last_mtp = 0;
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(records[i].step.mtp_losses.size(), 1u);
    first += records[i].step.loss / 5;
    first_mtp += records[i].step.mtp_losses[0] / 5;
    last += records[25 + i].step.loss / 5;
    last_mtp += records[25 + i].step.mtp_losses[0] / 5;
  }
  EXPECT_NEAR(first_mtp, std::log(256.0), 0.3);
  EXPECT_LT(last, first - 1.0) << log;
  EXPECT_LT(last_mtp, first_mtp - 0.5) << log;
  EXPECT_NE(log.find(" | mtp_1 loss: "), std::string::npos) << log;
}

// Trains 2k iterations under `lr` straight, and k then k more resumed from a checkpoint: the two agree
// exactly. Returns the straight run's records.
std::vector<IterationRecord> expect_resume_reproduces(const LrScheduleConfig& lr, const std::string& name) {
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() /
      ("megatune_resume_" + name + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
       std::to_string(reinterpret_cast<std::uintptr_t>(&root) % 100000));
  std::filesystem::remove_all(root);
  const int k = 6;
  RunConfig whole = tiny_run(2 * k);
  whole.trainer.lr = lr;
  const std::vector<IterationRecord> straight = train(whole);

  RunConfig first_half = tiny_run(k);
  first_half.save = root.string();
  // The schedule must be the one of the full run, only stopped early.
  first_half.trainer.lr = lr;
  const std::vector<IterationRecord> a = train(first_half);
  RunConfig second_half = whole;
  second_half.load = root.string();
  std::string log;
  const std::vector<IterationRecord> b = train(second_half, &log);
  EXPECT_NE(log.find("loaded checkpoint"), std::string::npos);
  EXPECT_EQ(a.size(), static_cast<std::size_t>(k));
  EXPECT_EQ(b.size(), static_cast<std::size_t>(k));
  for (int i = 0; i < k && i < static_cast<int>(std::min(a.size(), b.size())); ++i) {
    EXPECT_EQ(a[i].step.loss, straight[i].step.loss) << "iteration " << i + 1;
    EXPECT_EQ(b[i].iteration, k + i + 1);
    EXPECT_EQ(b[i].step.loss, straight[k + i].step.loss) << "iteration " << k + i + 1;
    EXPECT_EQ(b[i].step.grad_norm, straight[k + i].step.grad_norm) << "iteration " << k + i + 1;
    EXPECT_EQ(b[i].step.learning_rate, straight[k + i].step.learning_rate);
  }
  std::filesystem::remove_all(root);
  return straight;
}

TEST(TrainTiny, ResumeReproducesTheLossTrajectoryExactly) {
  expect_resume_reproduces(tiny_run(12).trainer.lr, "plain");
}

// --decoupled-lr / --decoupled-min-lr: the embedding's own rate is in the resumed schedule as in the
// straight one, the logged rate stays the default group's, and the trajectory differs from a run without.
TEST(TrainTiny, ResumeKeepsTheDecoupledLearningRate) {
  LrScheduleConfig lr = tiny_run(12).trainer.lr;
  const std::vector<IterationRecord> plain = train(tiny_run(12));
  lr.decoupled_max_lr = 3e-2;
  lr.decoupled_min_lr = 3e-3;
  const std::vector<IterationRecord> decoupled = expect_resume_reproduces(lr, "decoupled");
  ASSERT_EQ(decoupled.size(), plain.size());
  // The first update is at the warm-up's rate 0 (no sample consumed yet), so the third loss is the first
  // that the embedding's own rate reaches.
  EXPECT_EQ(decoupled[1].step.loss, plain[1].step.loss);
  EXPECT_NE(decoupled[2].step.loss, plain[2].step.loss);
  for (std::size_t i = 0; i < plain.size(); ++i)
    EXPECT_EQ(decoupled[i].step.learning_rate, plain[i].step.learning_rate) << i;
}

TEST(TrainTiny, LoadingAnotherModelShapeIsAClearError) {
  const std::filesystem::path root = std::filesystem::temp_directory_path() / "megatune_resume_mismatch";
  std::filesystem::remove_all(root);
  RunConfig save = tiny_run(1);
  save.save = root.string();
  train(save);
  RunConfig other = tiny_run(2);
  other.trainer.model.num_layers = 3;
  other.load = root.string();
  EXPECT_THROW(train(other), UserError);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace megatune::executor
