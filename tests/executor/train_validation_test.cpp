// Validation and test loss (Megatron's evaluate): the logged validation loss equals an independent
// forward over the same samples, the log lines follow Megatron's framed format, and every parallel layout
// (TP, PP with its forward-only schedule, interleaved PP, DP) reports the single-rank losses.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>

#include "executor/data/data_loader.h"
#include "executor/data/dataset_builder.h"
#include "executor/training/run_setup.h"
#include "executor/training/thread_run.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "tests/executor/parallel_test_models.h"

namespace megatune::executor {
namespace {

TrainOptions options() {
  TrainOptions o;
  o.lr = 3e-3;
  o.lr_warmup_iters = 1;
  o.train_iters = 4;
  o.mock_data = true;
  o.log_interval = 4;
  o.eval_interval = 2;
  o.eval_iters = 2;
  return o;
}

layouts::ParallelConfig layout(const layouts::ModelSpec& model, int tp, int pp, int dp, int vpp = 0) {
  layouts::ParallelConfig c;
  c.tensor_model_parallel_size = tp;
  c.pipeline_model_parallel_size = pp;
  c.world_size = tp * pp * dp;
  c.micro_batch_size = 2;
  c.global_batch_size = 8;
  c.num_virtual_stages_per_pipeline_rank = vpp;
  c.overlap_p2p_comm = vpp > 0;
  c.validate(model);
  return c;
}

// The last rank's evaluations of a run.
std::vector<EvaluationRecord> evaluations(const layouts::ModelSpec& model, const layouts::ParallelConfig& c,
                                          std::string* log_text = nullptr,
                                          const std::function<void(TrainingRun&)>& inspect = {}) {
  std::ostringstream log;
  std::vector<EvaluationRecord> out;
  train_on_threads(model, c, options(), log, [&](int rank, TrainingRun& run) {
    if (rank != c.world_size - 1) return;
    out = run.evaluations();
    if (inspect) inspect(run);
  });
  if (log_text) *log_text = log.str();
  return out;
}

TEST(TrainValidation, LossEqualsAnIndependentForwardAndIsLoggedAsMegatronDoes) {
  const layouts::ModelSpec model = test::gpt_tiny(true);
  const layouts::ParallelConfig single = layout(model, 1, 1, 1);
  std::string log;
  double independent = 0, tokens = 0;
  const std::vector<EvaluationRecord> records = evaluations(model, single, &log, [&](TrainingRun& run) {
    // The test split's first eval_iters global batches through the trained model, one micro-batch at a time.
    const RunConfig config = build_run_config(model, single, options(), 0);
    data::DataConfig data = config.data;
    data.gpt.sequence_length = config.trainer.batch.seq;
    const std::int64_t gbs = config.trainer.global_batch_size();
    const auto datasets = data::build_train_valid_test_datasets(data, {0, 0, options().eval_iters * gbs});
    data::PretrainingDataLoader loader(datasets.test, {gbs, config.trainer.batch.micro_batch, 0, 1, 0});
    MicroBatch mb;
    for (std::int64_t i = 0; i < options().eval_iters * config.trainer.batch.num_microbatches; ++i) {
      ASSERT_TRUE(loader.next(mb));
      double counted = 0;
      for (const float m : mb.loss_mask) counted += m;
      independent += run.trainer().model().evaluate(mb) * counted;
      tokens += counted;
    }
  });
  // Iterations 2 and 4, then after training the validation and the test set.
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[0].iteration, 2);
  EXPECT_EQ(records[1].iteration, 4);
  EXPECT_TRUE(records[2].final && records[2].split == "validation");
  EXPECT_TRUE(records[3].final && records[3].split == "test");
  EXPECT_EQ(records[3].tokens, tokens);
  EXPECT_NEAR(records[3].loss, independent / tokens, 1e-6 * independent / tokens);
  // The validation split moves on between evaluations: the final one reads other samples than iteration 4's.
  EXPECT_NE(records[1].loss, records[2].loss);
  EXPECT_LT(records[1].loss, records[0].loss + 0.5);

  const std::string line = " validation loss at iteration 2 | lm loss value: ";
  const std::size_t at = log.find(line);
  ASSERT_NE(at, std::string::npos) << log;
  const std::size_t end = log.find('\n', at);
  const std::string text = log.substr(at, end - at);
  const std::string dashes(text.size() + 1, '-');
  EXPECT_EQ(log.substr(at - dashes.size() - 1, dashes.size() + 1), dashes + "\n");
  EXPECT_EQ(log.substr(end + 1, dashes.size()), dashes);
  EXPECT_NE(text.find(" | lm loss PPL: "), std::string::npos);
  EXPECT_NE(log.find(" validation loss at iteration 4 on validation set | "), std::string::npos);
  EXPECT_NE(log.find(" validation loss at iteration 4 on test set | "), std::string::npos);
}

TEST(TrainValidation, FormatsValueAndPerplexityInMegatronsScientificNotation) {
  const std::string lines = format_evaluation_lines("iteration 7", std::log(250.0));
  const std::string middle =
      " validation loss at iteration 7 | lm loss value: 5.521461E+00 | lm loss PPL: "
      "2.500000E+02 | ";
  EXPECT_EQ(lines,
            std::string(middle.size() + 1, '-') + "\n" + middle + "\n" + std::string(middle.size() + 1, '-'));
  EXPECT_NE(format_evaluation_lines("x", 30.0).find("PPL: 4.851652E+08"), std::string::npos);  // exp(20)
}

TEST(TrainValidation, ParallelLayoutsReportTheSingleRankLosses) {
  const layouts::ModelSpec model = test::llama_tiny(false);
  const std::vector<EvaluationRecord> single = evaluations(model, layout(model, 1, 1, 1));
  ASSERT_EQ(single.size(), 4u);
  struct Case {
    const char* name;
    int tp, pp, dp, vpp;
  };
  for (const Case& c : {Case{"tp2 pp2 dp2", 2, 2, 2, 0}, Case{"pp2 vpp2", 1, 2, 1, 2}}) {
    SCOPED_TRACE(c.name);
    const std::vector<EvaluationRecord> parallel = evaluations(model, layout(model, c.tp, c.pp, c.dp, c.vpp));
    ASSERT_EQ(parallel.size(), single.size());
    for (std::size_t i = 0; i < single.size(); ++i) {
      EXPECT_EQ(parallel[i].tokens, single[i].tokens);
      EXPECT_NEAR(parallel[i].loss, single[i].loss, 2e-5 * single[i].loss) << "evaluation " << i;
    }
  }
}

}  // namespace
}  // namespace megatune::executor
