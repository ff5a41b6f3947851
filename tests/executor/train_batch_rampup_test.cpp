// Megatron's batch-size ramp-up (--rampup-batch-size): the calculator's global batch and micro-batch count
// per consumed samples and the iterations of a --train-samples run against Megatron-Core's
// RampupBatchsizeNumMicroBatchesCalculator and update_train_iters (the values below are what that Python
// code returns for the same settings), the refusals where Megatron asserts, and training: a ramped tiny run
// consumes and logs the ramp's batches, equals the same batch sizes run by hand (one run per batch size,
// each resuming the last one's checkpoint), resumes mid-ramp onto the uninterrupted losses, and under
// data-parallel and pipelined layouts (ranks as threads) reproduces the single-rank run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "base/user_error.h"
#include "executor/cpu/cpu_backend.h"
#include "executor/data/preprocess.h"
#include "executor/parallel/communicator.h"
#include "executor/training/batch_size_rampup.h"
#include "executor/training/run_setup.h"
#include "executor/training/thread_run.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "tests/executor/parallel_test_models.h"

namespace megatune::executor {
namespace {

struct Expected {
  std::int64_t consumed, global_batch;
  int microbatches;
};

void expect_calculator(const MicroBatchCalculator& c, const std::vector<Expected>& expected) {
  for (const Expected& e : expected) {
    EXPECT_EQ(c.global_batch_size(e.consumed), e.global_batch) << "after " << e.consumed << " samples";
    EXPECT_EQ(c.num_microbatches(e.consumed), e.microbatches) << "after " << e.consumed << " samples";
  }
}

TEST(BatchSizeRampup, MatchesMegatronsCalculator) {
  // GPT-3 175B's ramp (examples/gpt3 before Megatron replaced it): 16 -> 1536 by 16 over 5859375 samples,
  // 95 increments of 61677.6 samples; micro-batch 1 on 16 data-parallel ranks.
  const MicroBatchCalculator gpt3(1536, 1, 16, BatchSizeRampup{16, 16, 5859375});
  expect_calculator(gpt3, {{0, 16, 1},
                           {46874, 16, 1},
                           {46876, 16, 1},
                           {3000000, 784, 49},
                           {5859374, 1520, 95},
                           {5859375, 1536, 96},
                           {5859376, 1536, 96},
                           {100000000, 1536, 96}});
  EXPECT_EQ(gpt3.train_iters_for_samples(5859375), 19802);
  EXPECT_EQ(gpt3.train_iters_for_samples(146484375), 111354);
  // An integral share per increment: 12 samples over 3 increments.
  const MicroBatchCalculator small(8, 2, 1, BatchSizeRampup{2, 2, 12});
  expect_calculator(small, {{0, 2, 1},
                            {3, 2, 1},
                            {4, 4, 2},
                            {7, 4, 2},
                            {8, 6, 3},
                            {11, 6, 3},
                            {12, 8, 4},
                            {13, 8, 4},
                            {14, 8, 4}});
  EXPECT_EQ(small.train_iters_for_samples(40), 7);
  EXPECT_EQ(small.train_iters_for_samples(14), 4);
  EXPECT_EQ(small.train_iters_for_samples(1), 1);  // Megatron runs the first batch whole
  EXPECT_EQ(small.samples_after(7), 38);
  EXPECT_EQ(small.first_final_iteration(), 5);  // batches 2, 2, 4, 6, then 8
  // A fractional share (100 samples over 7 increments) under data parallelism.
  const MicroBatchCalculator fractional(64, 4, 2, BatchSizeRampup{8, 8, 100});
  expect_calculator(fractional, {{0, 8, 1},
                                 {14, 8, 1},
                                 {15, 16, 2},
                                 {28, 16, 2},
                                 {29, 24, 3},
                                 {42, 24, 3},
                                 {43, 32, 4},
                                 {85, 48, 6},
                                 {86, 56, 7},
                                 {99, 56, 7},
                                 {100, 64, 8},
                                 {101, 64, 8}});
  EXPECT_EQ(fractional.train_iters_for_samples(100), 6);
  EXPECT_EQ(fractional.train_iters_for_samples(101), 6);
  EXPECT_EQ(fractional.train_iters_for_samples(500), 11);
  EXPECT_EQ(fractional.train_iters_for_samples(7), 1);
  EXPECT_EQ(fractional.first_final_iteration(), 7);  // 8, 8, 16, 24, 32, 56, then 64
  // Without a ramp: the constant calculator.
  const MicroBatchCalculator constant(64, 4, 2);
  EXPECT_EQ(constant.num_microbatches(12345), 8);
  EXPECT_EQ(constant.train_iters_for_samples(130), 2);
  EXPECT_EQ(constant.describe(), "");
}

void expect_refusal(const std::function<void()>& f, const std::string& says) {
  try {
    f();
    ADD_FAILURE() << "not refused: " << says;
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(says), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST(BatchSizeRampup, RefusesWhatMegatronAsserts) {
  const auto calc = [](std::int64_t gbs, std::int64_t mbs, std::int64_t dp, BatchSizeRampup r) {
    return [=] { MicroBatchCalculator(gbs, mbs, dp, r).check_batches(100); };
  };
  expect_refusal(calc(8, 2, 1, {2, 4, 12}), "interval (6) is not divisible by the batch size increment (4)");
  expect_refusal(calc(8, 2, 1, {16, 2, 12}), "to be greater than or equal to the start batch size (16)");
  expect_refusal(calc(8, 2, 1, {0, 2, 12}), "the start batch size should be positive");
  expect_refusal(calc(8, 2, 1, {2, 0, 12}), "the batch size increment should be positive");
  expect_refusal(calc(8, 2, 1, {2, 2, 0}), "the ramp-up samples should be positive");
  expect_refusal(calc(8, 2, 1, {8, 2, 12}), "a ramp-up of no increments");
  // The consistency check of each iteration's batch: 3 and 5 are not multiples of micro-batch 2 x dp 1.
  expect_refusal(calc(7, 2, 1, {3, 2, 12}), "the global batch size 3 (after 0 samples) is not divisible");
  expect_refusal(calc(8, 2, 2, {2, 2, 12}), "micro-batch-size (2) times data parallel size (2)");
  expect_refusal([] { MicroBatchCalculator(10, 4, 1); }, "--global-batch-size 10 is not divisible");
  // Iteration-based training with a ramp-up (Megatron: expected no batch-size rampup for iteration-based
  // training).
  TrainOptions iters;
  iters.rampup_batch_size = BatchSizeRampup{2, 2, 12};
  expect_refusal([&] { resolve_sample_schedule(iters, 8, true); },
                 "give --train-samples instead of --train-iters");
  TrainOptions samples = iters;
  samples.train_samples = 40;
  resolve_sample_schedule(samples, 8, false);
  EXPECT_EQ(samples.train_iters, 7);
  // A ramp-up batch the interleaved schedule cannot run (fewer micro-batches than pp).
  const layouts::ModelSpec spec = test::llama_tiny(true);
  layouts::ParallelConfig interleaved;
  interleaved.world_size = 2;
  interleaved.pipeline_model_parallel_size = 2;
  interleaved.num_virtual_stages_per_pipeline_rank = 2;
  interleaved.overlap_p2p_comm = true;
  interleaved.micro_batch_size = 1;
  interleaved.global_batch_size = 4;
  interleaved.validate(spec);
  TrainOptions o = samples;
  o.rampup_batch_size = BatchSizeRampup{1, 1, 6};
  o.train_samples = 20;
  resolve_sample_schedule(o, 4, false);
  expect_refusal([&] { batch_size_calculator(spec, interleaved, o); }, "the ramp-up's global batch 1: ");
}

layouts::ParallelConfig layout(int gbs, int mbs, int dp = 1, int pp = 1) {
  layouts::ParallelConfig c;
  c.world_size = dp * pp;
  c.pipeline_model_parallel_size = pp;
  c.micro_batch_size = mbs;
  c.global_batch_size = gbs;
  return c;
}

// The frozen byte-level text corpus (tests/executor/data) as a Megatron .bin/.idx dataset, written once per
// test binary: a small dataset whose index builds at once (the mock corpus holds 100000 documents).
std::string text_dataset() {
  struct Written {
    std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("megatune_rampup_text_" + std::to_string(::getpid()));
    std::string prefix;
    Written() {
      std::filesystem::create_directories(dir);
      data::PreprocessConfig pre;
      pre.input_path = std::string(MEGATUNE_SOURCE_DIR) + "/tests/executor/data/byte_level_corpus.txt";
      pre.output_prefix = (dir / "text").string();
      prefix = data::preprocess_data(pre).outputs.at(0).path_prefix;
    }
    ~Written() { std::filesystem::remove_all(dir); }
  };
  static const Written written;
  return written.prefix;
}

TrainOptions ramp_options(std::int64_t train_samples) {
  TrainOptions o;
  o.lr = 3e-3;
  o.lr_decay_style = "constant";
  o.data_path = {text_dataset()};
  o.split = "1,0,0";
  o.log_interval = 1;
  o.train_samples = train_samples;
  o.rampup_batch_size = BatchSizeRampup{2, 2, 12};
  return o;
}

struct RunResult {
  std::vector<IterationRecord> records;
  std::vector<std::int64_t> consumed;  // after each iteration
  std::string log;
};

RunResult train(RunConfig config) {
  CpuBackend backend;
  SingleRankCommunicator communicator(backend);
  std::ostringstream log;
  TrainingRun run(std::move(config), backend, communicator, log);
  RunResult out;
  out.records = run.run();
  out.log = log.str();
  return out;
}

RunResult train(const layouts::ModelSpec& spec, layouts::ParallelConfig parallel, TrainOptions options) {
  parallel.validate(spec);
  resolve_sample_schedule(options, parallel.resolved_global_batch_size(), false);
  return train(build_run_config(spec, parallel, options, 0));
}

std::string line_of(const std::string& log, int iteration) {
  char tag[32];
  std::snprintf(tag, sizeof(tag), "iteration %8d/", iteration);
  const std::size_t at = log.find(tag);
  return at == std::string::npos ? "" : log.substr(at, log.find('\n', at) - at);
}

TEST(BatchSizeRampup, TracesTheFinalBatch) {
  // A traced run's window (and the manifest's batch that compare prices) is the final global batch's.
  const layouts::ModelSpec spec = layouts::model_preset("tiny");
  layouts::ParallelConfig parallel = layout(8, 2);
  parallel.validate(spec);
  TrainOptions o = ramp_options(40);
  o.trace.dir = "trace";
  resolve_sample_schedule(o, 8, false);
  const RunConfig run = build_run_config(spec, parallel, o, 0);
  EXPECT_EQ(run.trace.first_iteration, 5);
  EXPECT_EQ(run.trace.iterations, 3);
  o.trace.first_iteration = 2;
  o.trace.iterations = 3;
  expect_refusal(
      [&] { build_run_config(spec, parallel, o, 0); },
      "the ramp-up runs smaller batches until iteration 5; trace from there (--trace-iterations 5:3)");
}

TEST(BatchSizeRampup, TinyRunConsumesAndLogsTheRamp) {
  const layouts::ModelSpec spec = layouts::model_preset("tiny");
  const RunResult r = train(spec, layout(8, 2), ramp_options(40));
  ASSERT_EQ(r.records.size(), 7u);
  const std::int64_t batches[] = {2, 2, 4, 6, 8, 8, 8};
  std::int64_t consumed = 0;
  for (int i = 0; i < 7; ++i) {
    consumed += batches[i];
    const std::string line = line_of(r.log, i + 1);
    std::ostringstream samples, batch;
    samples << "consumed samples: " << std::setw(12) << consumed;
    batch << "global batch size: " << std::setw(5) << batches[i];
    EXPECT_NE(line.find(samples.str()), std::string::npos) << line;
    EXPECT_NE(line.find(batch.str()), std::string::npos) << line;
    EXPECT_TRUE(std::isfinite(r.records[i].step.loss));
  }
  EXPECT_NE(r.log.find("batch-size ramp-up: global batch 2 -> 8 in steps of 2 over 12 samples"),
            std::string::npos)
      << r.log;
  for (const char* change : {"ramping up batch size from 2 to 4", "ramping up batch size from 4 to 6",
                             "ramping up batch size from 6 to 8"})
    EXPECT_NE(r.log.find(change), std::string::npos) << r.log;
}

TEST(BatchSizeRampup, EqualsTheSameBatchSizesRunByHand) {
  // The ramp's batches 2, 2, 4, 6, 8, 8, 8 as four runs at a constant global batch, each resuming the
  // last one's checkpoint (the same data: each builds the split for the ramped run's 40 samples).
  const layouts::ModelSpec spec = layouts::model_preset("tiny");
  const RunResult ramped = train(spec, layout(8, 2), ramp_options(40));
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("megatune_rampup_by_hand_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::vector<double> by_hand;
  const struct {
    int gbs;
    std::int64_t until;
  } phases[] = {{2, 2}, {4, 3}, {6, 4}, {8, 7}};
  for (const auto& p : phases) {
    TrainOptions o = ramp_options(40);
    o.rampup_batch_size.reset();
    o.train_samples.reset();
    o.train_iters = p.until;
    o.save = o.load = dir.string();
    o.overwrite_checkpoints = true;
    layouts::ParallelConfig parallel = layout(p.gbs, 2);
    parallel.validate(spec);
    RunConfig run = build_run_config(spec, parallel, o, 0);
    run.train_samples = 40;
    for (const IterationRecord& r : train(std::move(run)).records) by_hand.push_back(r.step.loss);
  }
  std::filesystem::remove_all(dir);
  ASSERT_EQ(by_hand.size(), ramped.records.size());
  for (std::size_t i = 0; i < by_hand.size(); ++i)
    EXPECT_DOUBLE_EQ(ramped.records[i].step.loss, by_hand[i]) << "iteration " << i + 1;
}

TEST(BatchSizeRampup, ResumesMidRampOntoTheUninterruptedLosses) {
  const layouts::ModelSpec spec = layouts::model_preset("tiny");
  const RunResult whole = train(spec, layout(8, 2), ramp_options(40));
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("megatune_rampup_resume_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  TrainOptions first = ramp_options(40);
  first.save = first.load = dir.string();
  first.exit_interval = 3;  // stops after iteration 3 (global batch 4; the next runs 6)
  const RunResult head = train(spec, layout(8, 2), first);
  ASSERT_EQ(head.records.size(), 3u);
  // Megatron saves when the micro-batch count changes: before iteration 3 (2 -> 4) here, then at the exit.
  EXPECT_TRUE(std::filesystem::exists(dir / "iter_0000002")) << head.log;
  std::ifstream latest(dir / "latest_checkpointed_iteration.txt");
  std::string text;
  latest >> text;
  EXPECT_EQ(text, "3");
  TrainOptions second = first;
  second.exit_interval = 0;
  const RunResult tail = train(spec, layout(8, 2), second);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(tail.records.size(), 4u);
  EXPECT_NE(line_of(tail.log, 4).find("global batch size:     6"), std::string::npos) << tail.log;
  for (std::size_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(head.records[i].step.loss, whole.records[i].step.loss);
  for (std::size_t i = 0; i < 4; ++i)
    EXPECT_DOUBLE_EQ(tail.records[i].step.loss, whole.records[i + 3].step.loss) << "iteration " << i + 4;
}

TEST(BatchSizeRampup, ParallelLayoutsMatchTheSingleRank) {
  // Micro-batch 1: the ramp 2 -> 8 runs 1 to 4 micro-batches per rank at dp 2, 2 to 8 at dp 1.
  const layouts::ModelSpec spec = test::llama_tiny(true);
  const auto run = [&](int dp, int pp, std::ostringstream& log, int vpp = 0) {
    layouts::ParallelConfig parallel = layout(8, 1, dp, pp);
    parallel.num_virtual_stages_per_pipeline_rank = vpp;
    parallel.overlap_p2p_comm = vpp > 1;  // interleaving at pp 2
    parallel.validate(spec);
    TrainOptions options = ramp_options(24);
    resolve_sample_schedule(options, 8, false);
    return train_on_threads(spec, parallel, options, log);
  };
  std::ostringstream single_log;
  const std::vector<IterationRecord> single = run(1, 1, single_log);
  ASSERT_EQ(single.size(), 5u);
  for (const auto& [dp, pp] : std::vector<std::pair<int, int>>{{2, 1}, {1, 2}, {2, 2}}) {
    std::ostringstream log;
    const std::vector<IterationRecord> records = run(dp, pp, log);
    ASSERT_EQ(records.size(), single.size()) << "dp" << dp << " pp" << pp;
    for (std::size_t i = 0; i < records.size(); ++i)
      EXPECT_NEAR(records[i].step.loss, single[i].step.loss, 2e-5 * std::abs(single[i].step.loss))
          << "dp" << dp << " pp" << pp << " iteration " << i + 1;
    EXPECT_NE(line_of(log.str(), 3).find("global batch size:     4"), std::string::npos) << log.str();
  }
  // The interleaved schedule (pp 2 x 2 virtual stages) rebuilt for 2, 4, 6 and 8 micro-batches.
  std::ostringstream log;
  const std::vector<IterationRecord> interleaved = run(1, 2, log, 2);
  ASSERT_EQ(interleaved.size(), single.size());
  for (std::size_t i = 0; i < single.size(); ++i)
    EXPECT_NEAR(interleaved[i].step.loss, single[i].step.loss, 2e-5 * std::abs(single[i].step.loss))
        << "pp2 vpp2 iteration " << i + 1;
}

}  // namespace
}  // namespace megatune::executor
