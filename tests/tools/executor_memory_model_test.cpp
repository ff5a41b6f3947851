// The executor's memory model as the planner sees it: each pipeline stage's arena from the trainer's sizing
// pass plus the buffers outside it, the peak stage reported; Megatron's model where the executor cannot size.
#include "tools/executor_memory_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "base/user_error.h"
#include "cost_models/cluster_spec.h"
#include "cost_models/cost_model.h"
#include "executor/backend/sizing_backend.h"
#include "executor/training/arena_sizing.h"
#include "layouts/model_spec.h"
#include "planner/op_pricer.h"
#include "planner/search.h"

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

void expect_peak_is_the_largest_stage(const layouts::ModelSpec& model,
                                      const layouts::ParallelConfig& config) {
  executor::TrainOptions bf16;  // the CUDA backend computes in bf16
  bf16.bf16 = true;
  std::int64_t largest = 0;
  int largest_pp = -1;
  for (int rank : executor::one_rank_per_stage(config)) {
    const std::unique_ptr<executor::Backend> backend = executor_sizing_backend();  // as the model sizes
    const executor::RankArena arena = executor::size_rank_arena(model, config, bf16, rank, *backend);
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

TEST(ExecutorMemoryModel, PeakIsTheLargestStageArenaPlusTheBuffersOutsideIt) {
  expect_peak_is_the_largest_stage(model_of("gpt-125m", 1024), layout(2, 2, 8));
}

// Expert parallelism: the MoE layers' expert rows (outside the arena, sized to the balanced routing) are in
// the sizing pass's total and so in the planner's peak; and that peak's MoE part does not grow with ep.
TEST(ExecutorMemoryModel, AnExpertParallelLayoutsPeakHoldsTheRoutedRows) {
  layouts::ModelSpec model = model_of("tiny-mixtral", 256);
  model.num_layers = 8;
  layouts::ParallelConfig ep2 = layout(2, 2, 16);
  ep2.world_size = 4;
  ep2.expert_model_parallel_size = 2;
  expect_peak_is_the_largest_stage(model, ep2);
  layouts::ParallelConfig ep1 = ep2;
  ep1.expert_model_parallel_size = 1;
  auto moe_rows = [&](const layouts::ParallelConfig& config) {
    executor::TrainOptions bf16;
    bf16.bf16 = true;
    const std::unique_ptr<executor::Backend> backend = executor_sizing_backend();
    std::int64_t bytes = 0;
    for (const executor::ArenaUse& u : executor::size_rank_arena(model, config, bf16, 0, *backend).breakdown)
      if (u.what.find("MoE expert") != std::string::npos) bytes += u.bytes;
    return bytes;
  };
  EXPECT_GT(moe_rows(ep2), 0);
  // The same rows at the experts (ep2 adds the all-to-all's received rows, one scratch buffer).
  EXPECT_LE(static_cast<double>(moe_rows(ep2)), 1.1 * static_cast<double>(moe_rows(ep1)));
}

// The largest stage arena plus the buffers, sizing every stage directly (what the cached function must give).
std::pair<std::int64_t, int> direct_peak(const layouts::ModelSpec& model,
                                         const layouts::ParallelConfig& config) {
  executor::TrainOptions bf16;
  bf16.bf16 = true;
  std::int64_t largest = -1;
  int largest_pp = -1;
  for (int rank : executor::one_rank_per_stage(config)) {
    const std::unique_ptr<executor::Backend> backend = executor_sizing_backend();  // as the model sizes
    const executor::RankArena arena = executor::size_rank_arena(model, config, bf16, rank, *backend);
    const std::int64_t total =
        arena.total_bytes + planner::estimate_memory(model, config, arena.coordinates.pp).buffer_bytes;
    if (total > largest) {
      largest = total;
      largest_pp = arena.coordinates.pp;
    }
  }
  return {largest, largest_pp};
}

// One function sizes a stage once and answers every later layout holding the same stage from its cache: the
// peaks equal direct sizing over interleaved, uneven, MoE and data-parallel layouts asked in turn.
TEST(ExecutorMemoryModel, StagesSizedOnceGiveTheSamePeaksAsSizingEveryStage) {
  // Head dim 64: a shape the CUDA attention kernels take, so a build with CUDA sizes these too.
  layouts::ModelSpec model = model_of("tiny", 128);
  layouts::ModelSpec moe = model_of("tiny-mixtral", 128);
  model.kv_channels = moe.kv_channels = 64;
  layouts::ModelSpec deeper = model;
  deeper.num_layers = 8;
  struct Asked {
    const layouts::ModelSpec* model;
    layouts::ParallelConfig config;
  };
  std::vector<Asked> asked;
  for (int vpp : {1, 2}) {
    layouts::ParallelConfig even = layout(4, 1, 16);
    if (vpp > 1) even.num_virtual_stages_per_pipeline_rank = vpp;
    asked.push_back({&deeper, even});
    layouts::ParallelConfig uneven = layout(4, 2, 16);
    uneven.pipeline_model_parallel_layout = vpp > 1 ? "Et|t|tt|t|t|t|t|L" : "Et|ttt|ttt|tL";
    asked.push_back({&deeper, uneven});
  }
  layouts::ParallelConfig data = layout(2, 1, 8);
  data.world_size = 4;
  data.use_distributed_optimizer = data.overlap_grad_reduce = true;
  asked.push_back({&model, data});
  // Megatron FSDP's optim_grads_params on the same grid: its own buckets (one per entry), its own stages.
  layouts::ParallelConfig fsdp = data;
  fsdp.use_distributed_optimizer = false;
  fsdp.use_megatron_fsdp = true;
  fsdp.data_parallel_sharding_strategy = layouts::DataParallelSharding::kOptimGradsParams;
  asked.push_back({&model, fsdp});
  layouts::ParallelConfig experts = layout(2, 1, 8);
  experts.world_size = 4;
  experts.expert_model_parallel_size = 2;
  asked.push_back({&moe, experts});
  const planner::PeakMemoryFunction peak_of = executor_peak_memory();
  for (int round = 0; round < 2; ++round) {
    for (const Asked& a : asked) {
      a.config.validate(*a.model);
      const auto [bytes, pp] = direct_peak(*a.model, a.config);
      const planner::MemoryEstimate peak = peak_of(*a.model, a.config, {});
      EXPECT_TRUE(peak.complete);
      EXPECT_EQ(peak.total_bytes, bytes) << a.config.pipeline_model_parallel_layout;
      EXPECT_EQ(peak.pp_rank, pp);
    }
  }
}

// Asked to stop above a capacity, the function returns at most the peak, marked incomplete when it stopped:
// below every stage's parameters and gradients it refuses before sizing anything.
TEST(ExecutorMemoryModel, StoppingAboveACapacityGivesALowerBoundOfThePeak) {
  layouts::ModelSpec model = model_of("gpt-125m", 1024);
  const layouts::ParallelConfig config = layout(4, 2, 16);
  const planner::PeakMemoryFunction peak_of = executor_peak_memory();
  const planner::MemoryEstimate full = peak_of(model, config, {});
  const std::int64_t buffers = planner::estimate_memory(model, config, 0).buffer_bytes;
  for (std::int64_t capacity :
       {std::int64_t(1), buffers + 1, full.total_bytes / 2, full.total_bytes - 1, full.total_bytes}) {
    planner::MemoryOptions options;
    options.stop_above_bytes = capacity;
    const planner::MemoryEstimate e = peak_of(model, config, options);
    EXPECT_LE(e.total_bytes, full.total_bytes) << capacity;
    if (capacity >= full.total_bytes) {
      EXPECT_TRUE(e.complete);
      EXPECT_EQ(e.total_bytes, full.total_bytes);
    } else {
      EXPECT_GT(e.total_bytes, capacity);  // still says it does not fit
    }
  }
}

// The bf16 arena of one rank per pipeline stage, as the sizing pass takes it.
std::vector<executor::RankArena> bf16_stage_arenas(const layouts::ModelSpec& model,
                                                   const layouts::ParallelConfig& config) {
  executor::TrainOptions bf16;
  bf16.bf16 = true;
  std::vector<executor::RankArena> arenas;
  for (int rank : executor::one_rank_per_stage(config)) {
    executor::SizingBackend backend;
    arenas.push_back(executor::size_rank_arena(model, config, bf16, rank, backend));
  }
  return arenas;
}

std::int64_t labelled_bytes(const executor::RankArena& arena, const std::string& what) {
  std::int64_t bytes = 0;
  for (const executor::ArenaUse& use : arena.breakdown)
    if (use.what == what) bytes += use.bytes;
  return bytes;
}

// The refusal before sizing counts 6 bytes (bf16 weights, fp32 gradients: Megatron's model) per parameter of
// the planner's count; the executor holds 8 (fp32 main parameters and gradients) per element of its own.
// Over dense, MoE, MLA and MTP stages the executor's elements are never fewer than 3/4 of the planner's
// parameters, so the refusal is below both models.
TEST(ExecutorMemoryModel, TheExecutorHoldsEightBytesPerPlannerParameterAtLeastSixOverEight) {
  for (const char* preset : {"gpt-125m", "tiny-mixtral", "tiny-deepseek-v3-full", "llama3-1b"}) {
    const layouts::ModelSpec model = model_of(preset, 128);
    layouts::ParallelConfig config = layout(2, 1, 8);
    config.world_size = 4;
    config.tensor_model_parallel_size = 2;
    config.sequence_parallel = true;
    if (model.is_moe()) config.tensor_model_parallel_size = 1, config.expert_model_parallel_size = 2;
    config.validate(model);
    for (const executor::RankArena& arena : bf16_stage_arenas(model, config)) {
      const std::int64_t main_bytes =
          labelled_bytes(arena, "fp32 main parameters") + labelled_bytes(arena, "fp32 main gradients");
      const std::int64_t parameters =
          planner::estimate_memory(model, config, arena.coordinates.pp).parameters;
      EXPECT_GE(main_bytes, 6 * parameters) << preset << " pp rank " << arena.coordinates.pp;
    }
  }
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

layouts::ParallelConfig fsdp_layout(const layouts::ModelSpec& model, int pp, int dp) {
  layouts::ParallelConfig c = layout(pp, 1, dp);
  c.world_size = pp * dp;
  c.use_megatron_fsdp = true;
  c.data_parallel_sharding_strategy = layouts::DataParallelSharding::kOptimGradsParams;
  c.validate(model);
  return c;
}

// Under FSDP optim_grads_params the executor's bf16 weights (its shard of every bucket and the gathered-entry
// slots, as train --dry-run sizes them) agree with Megatron's model (the planner's 2/d per parameter plus
// the gathered entries) within the buckets' padding, on every pipeline stage: untied llama3-8b at dp2 and
// dp4, tied gpt-1.3b at dp4 and under pp2 x dp2.
TEST(ExecutorMemoryModel, FsdpWeightsAgreeWithMegatronsModel) {
  struct Case {
    const char* model;
    int pp, dp;
  };
  for (const Case c :
       {Case{"llama3-8b", 1, 2}, Case{"llama3-8b", 1, 4}, Case{"gpt-1.3b", 1, 4}, Case{"gpt-1.3b", 2, 2}}) {
    const layouts::ModelSpec model = model_of(c.model, 2048);
    const layouts::ParallelConfig config = fsdp_layout(model, c.pp, c.dp);
    for (const executor::RankArena& arena : bf16_stage_arenas(model, config)) {
      const std::int64_t weights = labelled_bytes(arena, "model parameters (compute dtype)");
      const double megatron =
          static_cast<double>(planner::estimate_memory(model, config, arena.coordinates.pp).weight_bytes);
      EXPECT_GE(static_cast<double>(weights), megatron) << c.model << " pp rank " << arena.coordinates.pp;
      EXPECT_LT(static_cast<double>(weights), 1.01 * megatron)
          << c.model << " pp rank " << arena.coordinates.pp;
    }
  }
}

// Under FSDP optim_grads and optim_grads_params the executor's fp32 gradients (its shard of every bucket and
// the whole-bucket slots, as train --dry-run sizes them) agree with Megatron's model (4/d per parameter plus
// layouts::kFsdpGradientBucketsInFlight slots of the largest bucket) within 1% on every pipeline stage.
TEST(ExecutorMemoryModel, FsdpGradientsAgreeWithMegatronsModel) {
  struct Case {
    const char* model;
    int pp, dp;
    layouts::DataParallelSharding sharding;
  };
  using S = layouts::DataParallelSharding;
  for (const Case c :
       {Case{"llama3-8b", 1, 4, S::kOptimGradsParams}, Case{"llama3-8b", 1, 2, S::kOptimGrads},
        Case{"gpt-1.3b", 2, 2, S::kOptimGradsParams}, Case{"gpt-1.3b", 1, 4, S::kOptimGrads}}) {
    const layouts::ModelSpec model = model_of(c.model, 2048);
    layouts::ParallelConfig config = fsdp_layout(model, c.pp, c.dp);
    config.data_parallel_sharding_strategy = c.sharding;
    config.validate(model);
    for (const executor::RankArena& arena : bf16_stage_arenas(model, config)) {
      const double grads = static_cast<double>(labelled_bytes(arena, "fp32 main gradients"));
      const planner::MemoryEstimate megatron = planner::estimate_memory(model, config, arena.coordinates.pp);
      const double whole = 4.0 * static_cast<double>(megatron.parameters);
      SCOPED_TRACE(std::string(c.model) + " pp rank " + std::to_string(arena.coordinates.pp) + " dp " +
                   std::to_string(c.dp) + " " + std::string(layouts::to_string(c.sharding)));
      EXPECT_NEAR(grads, static_cast<double>(megatron.gradient_bytes), 0.01 * megatron.gradient_bytes);
      EXPECT_LT(grads, whole);  // below the whole fp32 gradient buffer
    }
  }
}

// Memory pressure: llama3-8b on 4 GPUs without TP, PP or recomputation, with the capacity set between the
// executor's peak under FSDP optim_grads_params and under the distributed optimizer (which holds every bf16
// weight). The search under megatune's memory model (the default) ranks FSDP first, every fitting candidate
// is FSDP, and without FSDP in the space nothing fits.
TEST(ExecutorMemoryModel, FsdpWinsWhereTheDistributedOptimizerDoesNotFit) {
  const cost_models::ClusterSpec cluster = cost_models::parse_cluster_spec("1x4xH200");
  const auto cost_model = cost_models::CostModel::from_embedded(cluster);
  const planner::CostModelPricer pricer(*cost_model);
  planner::PlanRequest request;
  request.model = model_of("llama3-8b", 4096);
  request.world_size = 4;
  request.global_batch_size = 8;
  request.space.tp = {1};
  request.space.pp = {1};
  request.space.cp = {1};
  request.space.micro_batch = {1};
  request.space.recompute = {layouts::RecomputeGranularity::kNone};
  request.memory_model = planner::MemoryModelKind::kMegatune;
  request.peak_memory_of = peak_memory_function(planner::MemoryModelKind::kMegatune);
  layouts::ParallelConfig distributed = layout(1, 1, 8);
  distributed.world_size = 4;
  distributed.use_distributed_optimizer = true;
  distributed.validate(request.model);
  const layouts::ParallelConfig fsdp = fsdp_layout(request.model, 1, 4);
  const double fsdp_peak = static_cast<double>(request.peak_memory_of(request.model, fsdp, {}).total_bytes);
  const double distributed_peak =
      static_cast<double>(request.peak_memory_of(request.model, distributed, {}).total_bytes);
  ASSERT_LT(fsdp_peak, distributed_peak);
  const double capacity = static_cast<double>(pricer.memory_capacity_bytes());
  ASSERT_LT(distributed_peak, capacity);
  request.memory_headroom_fraction = 1.0 - (fsdp_peak + distributed_peak) / 2 / capacity;
  const planner::PlanResult result = planner::plan(request, pricer);
  ASSERT_FALSE(result.ranked.empty());
  for (const planner::PlanCandidate& candidate : result.ranked)
    EXPECT_TRUE(candidate.config.shards_parameters()) << planner::describe(candidate);
  EXPECT_GT(result.statistics.out_of_memory, 0);
  request.space.fsdp.clear();
  EXPECT_THROW(planner::plan(request, pricer), UserError);
}

}  // namespace
}  // namespace megatune::tools
