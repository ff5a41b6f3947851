// The executor's memory model as the planner sees it: each pipeline stage's arena from the trainer's sizing
// pass plus the buffers outside it, the peak stage reported; Megatron's model where the executor cannot size.
#include "tools/executor_memory_model.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "executor/backend/sizing_backend.h"
#include "executor/training/arena_sizing.h"
#include "layouts/model_spec.h"

namespace megatune::tools {
namespace {

layouts::ParallelConfig layout(int pp, int mbs, int gbs) {
  layouts::ParallelConfig c;
  c.world_size = pp;
  c.pipeline_model_parallel_size = pp;
  c.micro_batch_size = mbs;
  c.global_batch_size = gbs;
  return c;
}

layouts::ModelSpec model_of(const std::string& preset, int seq) {
  layouts::ModelSpec m = layouts::model_preset(preset);
  m.seq_length = seq;
  return m;
}

TEST(ExecutorMemoryModel, PeakIsTheLargestStageArenaPlusTheBuffersOutsideIt) {
  const layouts::ModelSpec model = model_of("gpt-125m", 1024);
  const layouts::ParallelConfig config = layout(2, 2, 8);
  executor::TrainOptions bf16;  // the CUDA backend computes in bf16
  bf16.bf16 = true;
  std::int64_t largest = 0;
  int largest_pp = -1;
  for (int rank : executor::one_rank_per_stage(config)) {
    executor::SizingBackend backend;
    const executor::RankArena arena = executor::size_rank_arena(model, config, bf16, rank, backend);
    const std::int64_t buffers = planner::estimate_memory(model, config, arena.coordinates.pp).buffer_bytes;
    if (arena.total_bytes + buffers > largest) {
      largest = arena.total_bytes + buffers;
      largest_pp = arena.coordinates.pp;
    }
  }
  const planner::MemoryEstimate peak = executor_peak_memory()(model, config, {});
  EXPECT_EQ(peak.total_bytes, largest);
  EXPECT_EQ(peak.pp_rank, largest_pp);
  std::int64_t items = 0;
  for (const planner::MemoryItem& item : peak.items) items += item.bytes;
  EXPECT_EQ(items, peak.total_bytes);  // the itemization adds up
}

TEST(ExecutorMemoryModel, ChunkedLogitsMakeTheExecutorsPeakSmallerThanMegatrons) {
  // gpt-1.3b at mbs 4: Megatron keeps the whole-sequence fp32 logits and a fragmentation margin; the executor
  // one logits chunk in one arena (measured on an H200: 30.92 GiB in use against 30.83 predicted here).
  const layouts::ModelSpec model = model_of("gpt-1.3b", 2048);
  const layouts::ParallelConfig config = layout(1, 4, 32);
  const std::int64_t megatune =
      peak_memory_function(planner::MemoryModelKind::kMegatune)(model, config, {}).total_bytes;
  const std::int64_t megatron =
      peak_memory_function(planner::MemoryModelKind::kMegatron)(model, config, {}).total_bytes;
  EXPECT_LT(static_cast<double>(megatune), 0.85 * static_cast<double>(megatron));
  EXPECT_GT(static_cast<double>(megatune), 28.0 * (1 << 30));
  EXPECT_LT(static_cast<double>(megatune), 33.0 * (1 << 30));
}

TEST(ExecutorMemoryModel, ALayoutTheExecutorCannotSizeIsPricedByMegatronsModelAndSaysSo) {
  layouts::ModelSpec model = model_of("tiny", 128);
  model.mtp_num_layers = 1;  // MTP with context parallelism: the executor refuses it
  layouts::ParallelConfig config = layout(1, 2, 8);
  config.context_parallel_size = 2;
  config.world_size = 2;
  const planner::MemoryEstimate peak = executor_peak_memory()(model, config, {});
  ASSERT_FALSE(peak.items.empty());
  EXPECT_EQ(peak.items.front().name, "(Megatron's model)");
  EXPECT_EQ(peak.total_bytes, planner::peak_memory(model, config).total_bytes);
}

}  // namespace
}  // namespace megatune::tools
