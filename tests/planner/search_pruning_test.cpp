// Pruning by the lower bound never drops a winner: the pruned search ranks the same top-1 and top-10 as an
// exhaustive one (every candidate simulated) over dense and MoE models, one- and two-node clusters, with and
// without --tp-comm-overlap and bf16 gradient reduction, in bf16 and FP8; and the bound stays below the
// simulated step time under those options.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cost_models/cluster_spec.h"
#include "cost_models/cost_model.h"
#include "planner/search.h"
#include "planner/simulator.h"

namespace megatune::planner {
namespace {

struct PruningCase {
  const char* model;
  int seq_length;
  const char* cluster;
  int global_batch_size;
  bool tp_comm_overlap;
  bool grad_reduce_in_bf16;
  bool full_recompute = false;  // --recompute-granularity full: uniform 1 and block at 1/4, 1/2 of a chunk
  // Megatron FSDP: every strategy (optim, optim_grads, optim_grads_params) searched beside DDP and the
  // distributed optimizer; else only optim_grads_params, as the search tries it under Megatron's memory
  // model.
  bool every_fsdp_strategy = false;
  // FP8 linears: nullptr (bf16), "delayed" (--fp8-format hybrid) or "tensorwise" (--fp8-format e4m3).
  const char* fp8 = nullptr;
};

layouts::Fp8Settings fp8_settings(const char* recipe) {
  layouts::Fp8Settings fp8;
  if (recipe == nullptr) return fp8;
  const bool tensorwise = std::string(recipe) == "tensorwise";
  fp8.format = tensorwise ? layouts::Fp8Format::kE4M3 : layouts::Fp8Format::kHybrid;
  fp8.recipe = tensorwise ? layouts::Fp8Recipe::kTensorwise : layouts::Fp8Recipe::kDelayed;
  return fp8;
}

void PrintTo(const PruningCase& c, std::ostream* out) {
  *out << c.model << " seq " << c.seq_length << " on " << c.cluster << " gbs " << c.global_batch_size
       << (c.tp_comm_overlap ? " --tp-comm-overlap" : "")
       << (c.grad_reduce_in_bf16 ? " --grad-reduce-in-bf16" : "")
       << (c.full_recompute ? " --recompute-granularity full" : "")
       << (c.every_fsdp_strategy ? " every FSDP strategy" : "")
       << (c.fp8 ? std::string(" fp8 ") + c.fp8 : std::string());
}

std::string case_name(const ::testing::TestParamInfo<PruningCase>& info) {
  std::string name = std::string(info.param.model) + "_" + info.param.cluster +
                     (info.param.tp_comm_overlap ? "_overlap" : "") +
                     (info.param.grad_reduce_in_bf16 ? "_bf16" : "") +
                     (info.param.full_recompute ? "_full_recompute" : "") +
                     (info.param.every_fsdp_strategy ? "_every_fsdp" : "") +
                     (info.param.fp8 ? std::string("_fp8_") + info.param.fp8 : std::string());
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

struct Pricing {
  std::unique_ptr<cost_models::CostModel> cost_model;
  std::unique_ptr<CostModelPricer> pricer;
  int world_size = 0;
  explicit Pricing(const std::string& spec) {
    const cost_models::ClusterSpec cluster = cost_models::parse_cluster_spec(spec);
    world_size = cluster.world_size();
    cost_model = cost_models::CostModel::from_embedded(cluster);
    pricer = std::make_unique<CostModelPricer>(*cost_model);
  }
};

PlanRequest request_of(const PruningCase& c, int world_size) {
  PlanRequest request;
  request.model = layouts::model_preset(c.model);
  request.model.seq_length = c.seq_length;
  request.world_size = world_size;
  request.global_batch_size = c.global_batch_size;
  request.tp_comm_overlap = c.tp_comm_overlap;
  if (c.tp_comm_overlap) request.space.sequence_parallel = {true};  // as plan sets it
  request.step.grad_reduce_in_bf16 = request.memory.grad_reduce_in_bf16 = c.grad_reduce_in_bf16;
  request.step.fp8 = request.memory.step.fp8 = fp8_settings(c.fp8);  // as plan sets them
  request.space.micro_batch = {1, 2};
  request.space.max_virtual_stages = 4;
  if (c.full_recompute) request.space.recompute = {layouts::RecomputeGranularity::kFull};
  request.memory_model = MemoryModelKind::kMegatron;  // FSDP is searched (SearchSpace::fsdp)
  if (c.every_fsdp_strategy)
    request.space.fsdp = {layouts::DataParallelSharding::kOptim, layouts::DataParallelSharding::kOptimGrads,
                          layouts::DataParallelSharding::kOptimGradsParams};
  request.threads = 2;
  return request;
}

// The bound (and the cheaper one without the gradient sync below it) stays below the step simulated at pass
// and kernel level; returns the pass-level step.
double expect_bound_below_simulation(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                                     const Pricing& pricing) {
  SimulationOptions kernel;
  kernel.granularity = SimulationGranularity::kKernel;
  const double pass_s = simulate(model, config, *pricing.pricer).step_time_s;
  const double kernel_s = simulate(model, config, *pricing.pricer, kernel).step_time_s;
  const double bound = step_time_lower_bound(model, config, *pricing.pricer);
  EXPECT_GT(bound, 0.0);
  EXPECT_LE(bound, pass_s);
  EXPECT_LE(bound, kernel_s * (1 + 1e-9));
  EXPECT_LE(step_time_lower_bound(model, config, *pricing.pricer, {}, BoundTerms::kPasses), bound);
  return pass_s;
}

class PrunedSearch : public ::testing::TestWithParam<PruningCase> {};

// Tolerance: step times agree to 1e-9 relative (both searches simulate the same candidates the same way;
// only ties may swap places, so configurations are compared where the times differ).
TEST_P(PrunedSearch, RanksTheSameTopOneAndTopTenAsExhaustiveSearch) {
  const PruningCase& c = GetParam();
  const Pricing pricing(c.cluster);
  PlanRequest pruned_request = request_of(c, pricing.world_size);
  pruned_request.top_k = 10;
  PlanRequest exhaustive_request = pruned_request;
  exhaustive_request.top_k = 1 << 30;  // above any candidate count: nothing is pruned by the bound
  const PlanResult pruned = plan(pruned_request, *pricing.pricer);
  const PlanResult exhaustive = plan(exhaustive_request, *pricing.pricer);
  EXPECT_EQ(exhaustive.statistics.pruned_by_bound, 0);
  EXPECT_GT(pruned.statistics.pruned_by_bound, 0) << "the case exercises no pruning";
  ASSERT_GE(exhaustive.ranked.size(), 10u);
  // Every searched FSDP strategy was simulated (the bound is checked against what it does).
  for (layouts::DataParallelSharding s : pruned_request.space.fsdp) {
    int simulated = 0;
    for (const PlanCandidate& p : exhaustive.ranked) simulated += p.config.fsdp() && p.config.sharding() == s;
    EXPECT_GT(simulated, 0) << "no FSDP " << layouts::to_string(s) << " candidate";
  }
  ASSERT_EQ(pruned.ranked.size(), 10u);
  for (std::size_t i = 0; i < pruned.ranked.size(); ++i) {
    const double want = exhaustive.ranked[i].simulation.step_time_s;
    const double got = pruned.ranked[i].simulation.step_time_s;
    EXPECT_NEAR(got, want, 1e-9 * want) << "rank " << i + 1 << ": pruned " << describe(pruned.ranked[i])
                                        << " vs exhaustive " << describe(exhaustive.ranked[i]);
  }
  if (c.full_recompute) {  // block's partial recomputation is searched and, recomputing less, ranks
    int block = 0;
    for (const PlanCandidate& p : exhaustive.ranked)
      block += p.config.recompute_method == layouts::RecomputeMethod::kBlock;
    EXPECT_GT(block, 0);
    EXPECT_EQ(exhaustive.ranked[0].config.recompute_method, layouts::RecomputeMethod::kBlock);
  }
  const bool tied =
      exhaustive.ranked[1].simulation.step_time_s == exhaustive.ranked[0].simulation.step_time_s;
  if (!tied) {
    EXPECT_EQ(describe(pruned.ranked[0]), describe(exhaustive.ranked[0]));
    EXPECT_EQ(pruned.ranked[0].layout, exhaustive.ranked[0].layout);
  }
}

INSTANTIATE_TEST_SUITE_P(
    ModelsClustersOptions, PrunedSearch,
    ::testing::Values(PruningCase{"llama3-1b", 2048, "1x8xH100", 64, false, false},
                      PruningCase{"llama3-1b", 2048, "1x8xH100", 64, true, false},
                      PruningCase{"gpt-1.3b", 2048, "2x8xH100", 64, true, true},
                      PruningCase{"mixtral-small", 2048, "1x8xH100", 32, true, false},
                      PruningCase{"llama3-3b", 4096, "2x4xH100", 32, true, false},
                      PruningCase{"llama3-1b", 2048, "1x8xH100", 64, false, false, true},
                      PruningCase{"llama3-1b", 2048, "1x8xH100", 64, false, false, false, true},
                      PruningCase{"gpt-1.3b", 2048, "2x8xH100", 64, true, true, false, true},
                      PruningCase{"mixtral-small", 2048, "1x8xH100", 32, true, false, false, true},
                      PruningCase{"llama3-1b", 2048, "1x8xH100", 64, false, false, false, false, "delayed"},
                      PruningCase{"gpt-1.3b", 2048, "2x8xH100", 64, true, true, false, false, "tensorwise"},
                      PruningCase{"llama3-3b", 4096, "2x4xH100", 32, true, false, true, false, "delayed"}),
    case_name);

// Partial full recomputation (uniform groups, block's first layers): the bound prices exactly the recomputed
// layers and stays below the simulated step, at pass and kernel level; recomputing fewer layers is faster.
TEST(LowerBound, StaysBelowTheSimulatedStepUnderPartialRecomputation) {
  const Pricing pricing("1x8xH100");
  layouts::ModelSpec model = layouts::model_preset("llama3-1b");
  model.seq_length = 2048;
  using layouts::RecomputeMethod;
  struct Unit {
    RecomputeMethod method;
    int layers;
  };
  for (int pp : {1, 2, 4}) {
    double previous_s = 0.0;
    for (const Unit u : {Unit{RecomputeMethod::kUniform, 1}, Unit{RecomputeMethod::kUniform, 2},
                         Unit{RecomputeMethod::kBlock, 3}, Unit{RecomputeMethod::kBlock, 1}}) {
      layouts::ParallelConfig config;
      config.world_size = 8;
      config.tensor_model_parallel_size = 2;
      config.pipeline_model_parallel_size = pp;
      config.global_batch_size = 16;
      config.recompute_granularity = layouts::RecomputeGranularity::kFull;
      config.recompute_method = u.method;
      config.recompute_num_layers = u.layers;
      config.validate(model);
      SCOPED_TRACE("pp " + std::to_string(pp) + " " + std::string(layouts::to_string(u.method)) + " " +
                   std::to_string(u.layers));
      const double pass_s = expect_bound_below_simulation(model, config, pricing);
      // Uniform 2 re-runs every layer as uniform 1 does; block recomputes fewer.
      if (u.method == RecomputeMethod::kBlock) {
        EXPECT_LT(pass_s, previous_s);
      }
      previous_s = pass_s;
    }
  }
}

// The bound under --tp-comm-overlap stays below the overlapped simulation, where the bound of the plain
// options (what pruning used to compare against) exceeds it.
TEST(LowerBound, TakesTheSimulationOptionsAndStaysBelowTheSimulatedStep) {
  const Pricing pricing("1x8xH100");
  layouts::ModelSpec model = layouts::model_preset("llama3-8b");
  model.seq_length = 4096;
  SimulationOptions overlapped;
  overlapped.tp_comm_overlap = true;
  int plain_bound_too_high = 0;
  for (int tp : {2, 4, 8}) {
    for (int pp : {1, 8 / tp}) {
      layouts::ParallelConfig config;
      config.world_size = 8;
      config.tensor_model_parallel_size = tp;
      config.pipeline_model_parallel_size = pp;
      config.sequence_parallel = true;
      config.global_batch_size = 16;
      config.use_distributed_optimizer = true;
      config.overlap_grad_reduce = config.overlap_param_gather = config.dp() > 1;
      config.validate(model);
      const double simulated = simulate(model, config, *pricing.pricer, overlapped).step_time_s;
      const double bound = step_time_lower_bound(model, config, *pricing.pricer, overlapped);
      EXPECT_GT(bound, 0.0);
      EXPECT_LE(bound, simulated) << "tp " << tp << " pp " << pp;
      if (step_time_lower_bound(model, config, *pricing.pricer) > simulated) ++plain_bound_too_high;
    }
  }
  EXPECT_GT(plain_bound_too_high, 0) << "no case where the plain bound would have pruned wrongly";
}

// Every FSDP strategy, with and without overlapped reduction and gathers, over TP, PP, CP and interleaved
// grids of a dense and an MoE model: the bound stays below the step simulated at pass and kernel level, and
// optim_grads_params (no gather after the step, gathers before every forward and backward) is priced slower
// than the distributed optimizer's step on the same grid.
TEST(LowerBound, StaysBelowTheSimulatedStepUnderEveryFsdpStrategy) {
  const Pricing pricing("1x8xH100");
  struct Grid {
    const char* model;
    int tp, pp, cp, vpp;
  };
  using layouts::DataParallelSharding;
  int gathers_slower = 0;
  for (const Grid g : {Grid{"llama3-1b", 1, 1, 1, 1}, Grid{"llama3-1b", 2, 2, 1, 1},
                       Grid{"llama3-1b", 1, 2, 2, 2}, Grid{"mixtral-small", 2, 1, 1, 1}}) {
    layouts::ModelSpec model = layouts::model_preset(g.model);
    model.seq_length = 2048;
    for (bool overlap : {false, true}) {
      double distributed_optimizer_s = 0.0;
      for (std::optional<DataParallelSharding> sharding :
           {std::optional<DataParallelSharding>{}, std::optional{DataParallelSharding::kOptim},
            std::optional{DataParallelSharding::kOptimGrads},
            std::optional{DataParallelSharding::kOptimGradsParams}}) {
        layouts::ParallelConfig config;
        config.world_size = 8;
        config.tensor_model_parallel_size = g.tp;
        config.pipeline_model_parallel_size = g.pp;
        config.context_parallel_size = g.cp;
        if (g.vpp > 1) config.num_virtual_stages_per_pipeline_rank = g.vpp;
        config.overlap_p2p_comm = g.vpp > 1;
        config.sequence_parallel = g.tp > 1;
        if (std::string(g.model) == "mixtral-small") config.expert_model_parallel_size = 2;
        config.global_batch_size = 16;
        config.use_distributed_optimizer = !sharding;
        config.use_megatron_fsdp = sharding.has_value();
        if (sharding) config.data_parallel_sharding_strategy = *sharding;
        config.overlap_grad_reduce = config.overlap_param_gather = overlap;
        config.validate(model);
        SCOPED_TRACE(std::string(g.model) + " tp " + std::to_string(g.tp) + " pp " + std::to_string(g.pp) +
                     " cp " + std::to_string(g.cp) + " vpp " + std::to_string(g.vpp) +
                     (sharding ? " fsdp " + std::string(layouts::to_string(*sharding)) : " dist-opt") +
                     (overlap ? " overlapped" : ""));
        const double pass_s = expect_bound_below_simulation(model, config, pricing);
        if (!sharding) distributed_optimizer_s = pass_s;
        if (sharding == DataParallelSharding::kOptimGradsParams)
          gathers_slower += pass_s > distributed_optimizer_s;
      }
    }
  }
  EXPECT_GT(gathers_slower, 0) << "optim_grads_params's gathers were never priced";
}

// Under FP8 the bound prices the FP8 GEMMs and casts as the simulation does: it stays below the FP8
// simulation at pass and kernel level, where the bound of the bf16 program (bf16 GEMMs, no casts) exceeds
// it; the pass level agrees with the kernel level (weight casts once, not per micro-batch).
TEST(LowerBound, PricesFp8AsTheSimulationDoes) {
  const Pricing pricing("1x8xH100");
  layouts::ModelSpec model = layouts::model_preset("llama3-8b");
  model.seq_length = 4096;
  int bf16_bound_too_high = 0;
  for (const char* recipe : {"delayed", "tensorwise"}) {
    SimulationOptions fp8;
    fp8.step.fp8 = fp8_settings(recipe);
    SimulationOptions kernel = fp8;
    kernel.granularity = SimulationGranularity::kKernel;
    for (int tp : {1, 2, 8}) {
      for (int pp : {1, 8 / tp}) {
        layouts::ParallelConfig config;
        config.world_size = 8;
        config.tensor_model_parallel_size = tp;
        config.pipeline_model_parallel_size = pp;
        config.sequence_parallel = tp > 1;
        config.global_batch_size = 16;
        config.use_distributed_optimizer = true;
        config.recompute_granularity = layouts::RecomputeGranularity::kSelective;
        config.validate(model);
        SCOPED_TRACE(std::string(recipe) + " tp " + std::to_string(tp) + " pp " + std::to_string(pp));
        const double pass_s = simulate(model, config, *pricing.pricer, fp8).step_time_s;
        const double kernel_s = simulate(model, config, *pricing.pricer, kernel).step_time_s;
        const double bound = step_time_lower_bound(model, config, *pricing.pricer, fp8);
        EXPECT_GT(bound, 0.0);
        EXPECT_LE(bound, pass_s);
        EXPECT_LE(bound, kernel_s * (1 + 1e-9));
        // The passes cast the FP8 weights once per iteration, as the kernel level does (micro-batch 0).
        EXPECT_NEAR(pass_s, kernel_s, 0.01 * kernel_s);
        if (step_time_lower_bound(model, config, *pricing.pricer) > pass_s) ++bf16_bound_too_high;
      }
    }
  }
  EXPECT_GT(bf16_bound_too_high, 0) << "no case where the bf16 bound would have pruned wrongly";
}

}  // namespace
}  // namespace megatune::planner
