// Megatron FSDP in the planner: the memory model's per-rank bytes of each sharding strategy, the simulator's
// price of the per-segment parameter gathers (both granularities), and the search's sharding dimension with
// the Megatron-LM command line it emits.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "cost_models/cluster_spec.h"
#include "cost_models/cost_model.h"
#include "planner/memory_model.h"
#include "planner/plan_report.h"
#include "planner/search.h"
#include "planner/simulator.h"

namespace megatune::planner {
namespace {

using layouts::DataParallelSharding;

layouts::ParallelConfig fsdp(int world, int tp, DataParallelSharding sharding) {
  layouts::ParallelConfig c;
  c.world_size = world;
  c.tensor_model_parallel_size = tp;
  c.global_batch_size = 2 * world;
  c.use_megatron_fsdp = true;
  c.data_parallel_sharding_strategy = sharding;
  return c;
}

// Per rank, with P the rank's parameters (after TP) and d = dp x cp, Megatron's bytes (bf16 weights, fp32
// gradients, 12 B of fp32 main parameters and Adam moments):
//   no_shard            2P       + 4P   + 12P
//   optim               2P       + 4P   + 12P/d
//   optim_grads         2P       + 4P/d + 2 x 4 x (largest bucket) + 12P/d
//   optim_grads_params  2P/d + 2 x 2 x (largest entry) + 4P/d + 2 x 4 x (largest bucket) + 12P/d
// (two gathered entries in flight; two whole-bucket gradient slots: the bucket being back-propagated and the
// one being reduce-scattered)
TEST(FsdpMemoryModel, BytesPerRankFallAsMegatronsFormulas) {
  layouts::ModelSpec model = layouts::model_preset("llama3-8b");
  model.seq_length = 4096;
  const int d = 8;
  for (const DataParallelSharding s :
       {DataParallelSharding::kNoShard, DataParallelSharding::kOptim, DataParallelSharding::kOptimGrads,
        DataParallelSharding::kOptimGradsParams}) {
    SCOPED_TRACE(std::string(layouts::to_string(s)));
    layouts::ParallelConfig c = fsdp(2 * d, 2, s);
    c.validate(model);
    const MemoryEstimate e = estimate_memory(model, c, 0);
    const std::int64_t p = e.parameters;
    const auto shard = [&](std::int64_t bytes, bool sharded) {
      return sharded ? bytes * ((p + d - 1) / d) : bytes * p;
    };
    const bool params = s == DataParallelSharding::kOptimGradsParams;
    const std::int64_t layer =
        layouts::stage_parameters(model, layouts::resolve_rank_shape(model, c),
                                  c.resolved_pipeline_layout(model).stages().at(0))
            .dense_per_layer_reverse.at(0);  // the loss entry: the LM head, the largest
    EXPECT_EQ(e.weight_bytes, shard(2, params) + (params ? 4 * layer : 0));
    const bool grads = s >= DataParallelSharding::kOptimGrads;
    const layouts::RankShape shape = layouts::resolve_rank_shape(model, c);
    const std::int64_t bucket = layouts::largest_grad_bucket_elements(
        shape, c, layouts::stage_parameters(model, shape, c.resolved_pipeline_layout(model).stages().at(0)));
    EXPECT_EQ(e.gradient_bytes, shard(4, grads) + (grads ? 2 * 4 * bucket : 0));
    EXPECT_EQ(e.optimizer_bytes, shard(12, s != DataParallelSharding::kNoShard));
  }
  // ZeRO-3 against DDP on 8 data-parallel ranks: about 1/8 of the parameter state.
  layouts::ParallelConfig ddp = fsdp(2 * d, 2, DataParallelSharding::kNoShard),
                          zero3 = fsdp(2 * d, 2, DataParallelSharding::kOptimGradsParams);
  const MemoryEstimate a = estimate_memory(model, ddp, 0), b = estimate_memory(model, zero3, 0);
  const double ratio = static_cast<double>(b.weight_bytes + b.gradient_bytes + b.optimizer_bytes) /
                       static_cast<double>(a.weight_bytes + a.gradient_bytes + a.optimizer_bytes);
  EXPECT_GT(ratio, 1.0 / d);
  EXPECT_LT(ratio, 1.5 / d);
}

// A chunk with MTP layers keeps whole fp32 gradients under optim_grads (layouts::chunk_shards_gradients): the
// MTP stage's rank counts 4 B per parameter and no bucket slot, the other stage's rank its shard and 2 slots.
TEST(FsdpMemoryModel, MtpChunkKeepsWholeGradients) {
  layouts::ModelSpec model = layouts::model_preset("tiny");
  model.num_layers = 4;
  model.mtp_num_layers = 1;
  layouts::ParallelConfig c = fsdp(4, 1, DataParallelSharding::kOptimGrads);
  c.pipeline_model_parallel_size = 2;
  c.pipeline_model_parallel_layout = "Ettt|tmL";
  c.validate(model);
  const layouts::RankShape shape = layouts::resolve_rank_shape(model, c);
  const layouts::PipelineLayout layout = c.resolved_pipeline_layout(model);
  const MemoryEstimate first = estimate_memory(model, c, 0), last = estimate_memory(model, c, 1);
  EXPECT_EQ(last.gradient_bytes, 4 * last.parameters);
  const std::int64_t bucket = layouts::largest_grad_bucket_elements(
      shape, c, layouts::stage_parameters(model, shape, *layout.stages_of_rank(0).at(0)));
  EXPECT_EQ(first.gradient_bytes, 4 * ((first.parameters + 1) / 2) + 2 * 4 * bucket);
}

// The gathered entries optim_grads_params holds beside its shard, each of the largest entry (the executor's
// slots: layouts::fsdp_gathered_entries): 2 without recomputation; a full-recompute unit's layers during its
// re-run, one more where the chunk's tied head keeps the word embedding gathered (llama3-1b on one stage).
TEST(FsdpMemoryModel, CountsARecomputeUnitsGatheredEntriesAndTheTiedEmbedding) {
  struct Case {
    const char* model;
    int unit_layers;  // full recomputation, uniform units of this many layers (0: none)
    int gathered;
  };
  for (const Case c :
       {Case{"llama3-1b", 0, 2}, Case{"llama3-1b", 1, 2}, Case{"llama3-1b", 4, 5}, Case{"llama3-8b", 4, 4}}) {
    SCOPED_TRACE(std::string(c.model) + " unit " + std::to_string(c.unit_layers));
    layouts::ModelSpec model = layouts::model_preset(c.model);
    model.seq_length = 4096;
    layouts::ParallelConfig config = fsdp(8, 1, DataParallelSharding::kOptimGradsParams);
    if (c.unit_layers > 0) {
      config.recompute_granularity = layouts::RecomputeGranularity::kFull;
      config.recompute_method = layouts::RecomputeMethod::kUniform;
      config.recompute_num_layers = c.unit_layers;
    }
    config.validate(model);
    const MemoryEstimate e = estimate_memory(model, config, 0);
    const layouts::StageParameters p =
        layouts::stage_parameters(model, layouts::resolve_rank_shape(model, config),
                                  config.resolved_pipeline_layout(model).stages().at(0));
    const std::int64_t largest =
        *std::max_element(p.dense_per_layer_reverse.begin(), p.dense_per_layer_reverse.end());
    EXPECT_EQ(e.weight_bytes, 2 * ((e.parameters + 7) / 8) + 2 * c.gathered * largest);
  }
}

// Compute per decoder-layer op; the FSDP gathers a fixed time; everything else free.
class GatherPricer : public OpPricer {
 public:
  double per_op_s = 0.0, gather_s = 1e-3;
  cost_models::OpCost price(const layouts::Op& op, const cost_models::CollectiveGroup&) const override {
    cost_models::OpCost c;
    if (op.role == layouts::OpRole::kFsdpParamGather)
      c.time_s = gather_s;
    else if (!op.is_communication() && op.layer >= 0)
      c.time_s = per_op_s;
    return c;
  }
  int gpus_per_node() const override { return 8; }
  double peak_bf16_tflops() const override { return 989.4; }
  std::int64_t memory_capacity_bytes() const override { return 80LL << 30; }
};

// dp2, 4 layers: 6 buckets (E, 4 layers, L). Without compute every gather stalls: 2 x 6 per micro-batch.
// With compute, the prefetch hides a gather behind the previous segment's compute: only the gathers with
// nothing (costly) before them stall: E and layer 0 in the forward (the embedding costs nothing here), L and
// the last layer in the backward.
TEST(FsdpSimulator, PricesTheGathersAndTheirPrefetch) {
  layouts::ModelSpec model = layouts::model_preset("tiny");
  model.num_layers = 4;
  layouts::ParallelConfig c = fsdp(2, 1, DataParallelSharding::kOptimGradsParams);
  c.validate(model);
  const int m = c.num_microbatches();
  for (const SimulationGranularity g : {SimulationGranularity::kPass, SimulationGranularity::kKernel}) {
    SCOPED_TRACE(g == SimulationGranularity::kPass ? "pass" : "kernel");
    SimulationOptions options;
    options.granularity = g;
    GatherPricer pricer;
    EXPECT_NEAR(simulate(model, c, pricer, options).step_time_s, 12 * m * pricer.gather_s, 1e-9);
    pricer.per_op_s = 1e-2;
    const double with_compute = simulate(model, c, pricer, options).step_time_s;
    pricer.gather_s = 0.0;
    const double compute_only = simulate(model, c, pricer, options).step_time_s;
    EXPECT_NEAR(with_compute - compute_only, 4 * m * 1e-3, 1e-9);
  }
}

TEST(FsdpSearch, ShardingIsADimensionAndReachesTheCommandLine) {
  const cost_models::ClusterSpec cluster = cost_models::parse_cluster_spec("1x8xH100");
  const auto cost_model = cost_models::CostModel::from_embedded(cluster);
  const CostModelPricer pricer(*cost_model);
  PlanRequest request;
  request.model = layouts::model_preset("llama3-1b");
  request.model.seq_length = 2048;
  request.world_size = 8;
  request.global_batch_size = 16;
  request.space.tp = {2};
  request.space.pp = {1};
  request.space.cp = {1};
  request.space.micro_batch = {1};
  request.space.recompute = {layouts::RecomputeGranularity::kSelective};
  request.space.sequence_parallel = {true};
  request.top_k = 10;
  const PlanResult all = plan(request, pricer);
  bool ddp = false, dist_opt = false, zero3 = false;
  for (const PlanCandidate& candidate : all.ranked) {
    ddp |= !candidate.config.shards_optimizer_state();
    dist_opt |= candidate.config.use_distributed_optimizer;
    zero3 |= candidate.config.shards_parameters();
  }
  EXPECT_TRUE(ddp && dist_opt && zero3) << all.ranked.size() << " ranked";
  request.space.distributed_optimizer.clear();  // FSDP only, as --use-megatron-fsdp pins it
  const PlanResult pinned = plan(request, pricer);
  ASSERT_FALSE(pinned.ranked.empty());
  const PlanCandidate& w = pinned.ranked[0];
  EXPECT_TRUE(w.config.shards_parameters()) << describe(w);
  EXPECT_GT(w.simulation.step_time_s, 0.0);
  const std::string megatron = shell_join("python pretrain_gpt.py", megatron_arguments(request.model, w));
  EXPECT_NE(megatron.find("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params"),
            std::string::npos)
      << megatron;
}

// Under megatune's own memory model (the executor's arena, which holds 1/d of the bf16 weights under
// optim_grads_params) FSDP is searched beside the distributed optimizer, and pinned alone as
// --use-megatron-fsdp pins it.
TEST(FsdpSearch, MegatuneMemoryModelSearchesIt) {
  const cost_models::ClusterSpec cluster = cost_models::parse_cluster_spec("1x8xH100");
  const auto cost_model = cost_models::CostModel::from_embedded(cluster);
  const CostModelPricer pricer(*cost_model);
  PlanRequest request;
  request.model = layouts::model_preset("llama3-1b");
  request.model.seq_length = 2048;
  request.world_size = 8;
  request.global_batch_size = 16;
  request.space.tp = {2};
  request.space.pp = {1};
  request.space.cp = {1};
  request.space.micro_batch = {1};
  request.space.recompute = {layouts::RecomputeGranularity::kSelective};
  request.space.sequence_parallel = {true};
  request.memory_model = MemoryModelKind::kMegatune;
  request.top_k = 10;
  const PlanResult open = plan(request, pricer);
  int fsdp = 0, others = 0;
  for (const PlanCandidate& candidate : open.ranked) (candidate.config.fsdp() ? fsdp : others) += 1;
  EXPECT_EQ(fsdp, 1);                           // one grid, one micro-batch size: optim_grads_params once
  EXPECT_EQ(others, 2);                         // DDP and the distributed optimizer
  request.space.distributed_optimizer.clear();  // as --use-megatron-fsdp pins it
  const PlanResult pinned = plan(request, pricer);
  ASSERT_EQ(pinned.ranked.size(), 1u);
  EXPECT_TRUE(pinned.ranked[0].config.fsdp()) << describe(pinned.ranked[0]);
  EXPECT_TRUE(pinned.ranked[0].config.shards_parameters()) << describe(pinned.ranked[0]);
}

}  // namespace
}  // namespace megatune::planner
