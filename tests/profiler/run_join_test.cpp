// Joining executed ops to the step program's op ids and storing the run.
#include "profiler/run_join.h"

#include <gtest/gtest.h>

#include "cost_models/cluster_spec.h"
#include "cost_models/cost_database.h"
#include "cost_models/record_store.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"

namespace megatune::profiler {
namespace {

TEST(RunJoin, ExecutedOpsMapToProgramIdsWithPrices) {
  const layouts::ModelSpec model = layouts::model_preset("tiny");
  layouts::ParallelConfig config;
  config.micro_batch_size = 2;
  config.global_batch_size = 4;  // two micro-batches
  config.validate(model);
  const layouts::StepProgram program = layouts::build_step_program(model, config, 0);
  const auto prices = cost_models::CostModel::from_embedded(cost_models::parse_cluster_spec("1x1xH200"));

  // What a single-GPU executor issues: every compute op in order, with a made-up measured time, plus one op
  // the program does not know.
  std::vector<MeasuredOp> executed;
  std::vector<std::size_t> program_index;
  for (std::size_t i = 0; i < program.ops.size(); ++i) {
    if (program.ops[i].is_communication()) continue;
    executed.push_back({program.ops[i], 1e-6 * double(executed.size() + 1)});
    program_index.push_back(i);
  }
  layouts::Op stranger;
  stranger.kind = layouts::OpKind::kGemm;
  stranger.m = 3, stranger.n = 5, stranger.k = 7;
  executed.insert(executed.begin() + 3, {stranger, 1.0});

  const JoinedRun joined = join_to_step_program(executed, program, *prices);
  EXPECT_EQ(joined.unmatched, 1);
  EXPECT_EQ(joined.matched_loosely, 0);
  ASSERT_EQ(joined.ops.size(), program_index.size());
  double expected_total = 0;
  for (std::size_t j = 0; j < joined.ops.size(); ++j) {
    EXPECT_EQ(joined.ops[j].op_id, static_cast<std::int64_t>(program_index[j]));
    EXPECT_GT(joined.ops[j].predicted_s, 0.0);
    EXPECT_EQ(joined.ops[j].op_text, layouts::to_string(program.ops[program_index[j]]));
    expected_total += joined.ops[j].measured_s;
  }
  EXPECT_DOUBLE_EQ(joined.measured_total_s, expected_total);

  // A relabelled op still matches on kind and shape.
  std::vector<MeasuredOp> relabelled = {executed.front()};
  relabelled[0].op.label = "renamed";
  EXPECT_EQ(join_to_step_program(relabelled, program, *prices).matched_loosely, 1);

  cost_models::Database database = cost_models::open_in_memory_cost_database();
  cost_models::RunRecord run;
  run.gpu = "H200 SXM";
  run.measured_step_time_s = joined.measured_total_s;
  run.predicted_step_time_s = joined.predicted_total_s;
  run.started_at = cost_models::utc_now_iso8601();
  const std::int64_t run_id = store_joined_run(database, run, joined);
  EXPECT_EQ(cost_models::load_runs(database).size(), 1u);
  EXPECT_EQ(cost_models::load_run_ops(database, run_id).size(), joined.ops.size());
}

}  // namespace
}  // namespace megatune::profiler
