// The pipeline runner's forward segments: the trainer runs each forward item of the walk segment by segment
// (layouts::StepItem::forward_groups: the embedding, each decoder layer, the head) and calls the forward
// segment hook before each, where a per-layer parameter gather is waited. On one rank the hooks come in
// layer order with every op between two hooks belonging to the hooked layer; on a pipeline of two ranks
// with two model chunks each, in the order of the rank's walk, in training and in evaluation.
#include <gtest/gtest.h>

#include <mutex>
#include <random>
#include <tuple>
#include <vector>

#include "executor/cpu/cpu_backend.h"
#include "executor/cpu/thread_communicator.h"
#include "executor/cpu/thread_world.h"
#include "executor/parallel/communicator.h"
#include "executor/parallel/process_groups.h"
#include "executor/training/run_setup.h"
#include "executor/training/trainer.h"
#include "layouts/rank_grid.h"
#include "layouts/schedule_walker.h"
#include "tests/executor/small_models.h"

namespace megatune::executor {
namespace {

using Hook = std::tuple<int, int, int>;  // (chunk, micro-batch, group)

std::vector<MicroBatch> batches(int count, std::int64_t tokens, int vocab) {
  std::mt19937 rng(7);
  std::vector<MicroBatch> out(count);
  for (MicroBatch& mb : out)
    for (std::int64_t t = 0; t < tokens; ++t) {
      mb.tokens.push_back(static_cast<std::int32_t>(rng() % vocab));
      mb.labels.push_back(static_cast<std::int32_t>(rng() % vocab));
      mb.loss_mask.push_back(1.0f);
    }
  return out;
}

TrainerConfig two_layer_config() {
  TrainerConfig c;
  c.model = test::gradient_check_model(/*llama=*/false);  // 2 layers, vocab 32, 8 positions
  c.batch.micro_batch = 2;
  c.batch.seq = 8;
  c.batch.num_microbatches = 2;
  c.compute_dtype = DType::kFP32;
  return c;
}

TEST(ForwardSegments, OneRankHooksEachLayerBeforeItsOps) {
  const TrainerConfig config = two_layer_config();
  CpuBackend backend;
  SingleRankCommunicator communicator(backend);
  Trainer trainer(config, single_stage_schedule(2, 2), backend, communicator);
  std::vector<Hook> hooks;
  std::vector<std::size_t> ops_before;  // ops recorded when each hook ran
  trainer.set_forward_segment_hook([&](int chunk, int microbatch, int group) {
    hooks.emplace_back(chunk, microbatch, group);
    ops_before.push_back(backend.recorder().ops().size());
  });
  backend.recorder().set_enabled(true);
  const std::vector<MicroBatch> data = batches(2, config.batch.micro_batch * config.batch.seq, 32);
  trainer.train_step(data);
  const std::vector<Hook> expected = {{0, 0, -1}, {0, 0, 0}, {0, 0, 1}, {0, 0, -2},
                                      {0, 1, -1}, {0, 1, 0}, {0, 1, 1}, {0, 1, -2}};
  EXPECT_EQ(hooks, expected);
  // Between a layer's hook and the next, every op is that layer's (the embedding's ops carry layer -1).
  const std::vector<layouts::Op>& ops = backend.recorder().ops();
  int layer_ops = 0;
  for (std::size_t h = 0; h + 1 < hooks.size(); ++h) {
    const int group = std::get<2>(hooks[h]);
    if (group == -2) continue;  // the head's segment runs up to the backward
    ASSERT_LT(ops_before[h], ops_before[h + 1]) << "segment " << h << " issued no op";
    for (std::size_t i = ops_before[h]; i < ops_before[h + 1]; ++i) {
      EXPECT_EQ(ops[i].layer, group) << ops[i].label << " in the segment of group " << group;
      EXPECT_EQ(ops[i].phase, layouts::OpPhase::kForward) << ops[i].label;
      layer_ops += group >= 0 ? 1 : 0;
    }
  }
  EXPECT_GT(layer_ops, 8);
  // Evaluation interprets the same segments.
  hooks.clear();
  trainer.evaluate(data);
  EXPECT_EQ(hooks, expected);
}

// pp 2, layout "Et|t|t|tL" (vpp 2): rank 0 holds stages 0 and 2, rank 1 stages 1 and 3.
TEST(ForwardSegments, PipelineRanksHookInTheOrderOfTheirWalk) {
  layouts::ModelSpec model = layouts::model_preset("tiny");
  model.num_layers = 4;
  layouts::ParallelConfig config;
  config.world_size = 2;
  config.pipeline_model_parallel_size = 2;
  config.global_batch_size = 4;
  config.pipeline_model_parallel_layout = "Et|t|t|tL";
  config.overlap_p2p_comm = true;  // vpp 2 at pp 2
  config.validate(model);
  const std::vector<std::vector<std::vector<int>>> groups_of_chunk = {{{-1, 0}, {2}}, {{1}, {3, -2}}};
  const layouts::RankGrid grid = layouts::RankGrid::from_config(config);
  std::mutex mutex;
  std::vector<std::vector<Hook>> trained(2), evaluated(2);
  run_thread_ranks(2, [&](int rank, ThreadWorld& world) {
    const RunConfig run = build_run_config(model, config, TrainOptions{}, rank);
    CpuBackend backend;
    ThreadCommunicator communicator(backend, world, ProcessGroups(grid, rank));
    Trainer trainer(run.trainer, run.schedule, backend, communicator);
    std::vector<Hook> hooks;
    trainer.set_forward_segment_hook(
        [&](int chunk, int microbatch, int group) { hooks.emplace_back(chunk, microbatch, group); });
    const std::vector<MicroBatch> data =
        batches(run.trainer.batch.num_microbatches, run.trainer.batch.micro_batch * run.trainer.batch.seq,
                run.trainer.model.vocab_size);
    trainer.train_step(data);
    std::vector<Hook> during_training = std::move(hooks);
    hooks.clear();
    trainer.evaluate(data);
    const std::lock_guard<std::mutex> lock(mutex);
    trained[rank] = std::move(during_training);
    evaluated[rank] = std::move(hooks);
  });
  for (int rank = 0; rank < 2; ++rank) {
    for (bool evaluation : {false, true}) {
      const layouts::RankStep walk = evaluation ? layouts::walk_rank_forward(model, config, rank)
                                                : layouts::walk_rank_step(model, config, rank);
      std::vector<Hook> expected;
      for (const layouts::StepItem& item : walk.items) {
        if (item.kind != layouts::StepItemKind::kForward) continue;
        EXPECT_EQ(item.forward_groups, groups_of_chunk[rank][item.chunk]) << "rank " << rank;
        for (int group : item.forward_groups) expected.emplace_back(item.chunk, item.microbatch, group);
      }
      EXPECT_EQ(expected.size(), 12u);  // 4 micro-batches x 3 segments on either rank
      EXPECT_EQ(evaluation ? evaluated[rank] : trained[rank], expected)
          << "rank " << rank << (evaluation ? " evaluation" : " training");
    }
  }
  EXPECT_EQ(trained[0].front(), (Hook{0, 0, -1}));
  EXPECT_EQ(trained[1].back(), (Hook{1, 3, -2}));
}

}  // namespace
}  // namespace megatune::executor
