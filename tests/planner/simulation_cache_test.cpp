// The search's shared simulation cache and the pipeline lower bound: a simulation priced through a cache that
// other layouts filled equals one priced from scratch; the bound (with and without the gradient-sync terms,
// cached or not) stays below the simulated step over dense, MoE, CP, VPP, uneven and DP layouts, and holds
// a pipeline's fill and drain; the cached gradient sync tells the data-parallel sharding and overlaps apart.
#include "planner/simulation_cache.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "cost_models/cluster_spec.h"
#include "cost_models/cost_model.h"
#include "planner/simulator.h"

namespace megatune::planner {
namespace {

struct Pricing {
  std::unique_ptr<cost_models::CostModel> cost_model;
  std::unique_ptr<CostModelPricer> pricer;
  explicit Pricing(const std::string& spec) {
    cost_model = cost_models::CostModel::from_embedded(cost_models::parse_cluster_spec(spec));
    pricer = std::make_unique<CostModelPricer>(*cost_model);
  }
};

struct Case {
  const char* model;
  int world, tp, pp, cp, ep, mbs, gbs;
  int vpp;             // > 1: interleaved with uniform chunks
  const char* layout;  // a layout string, or ""
  bool dopt;
};

layouts::ModelSpec model_of(const Case& c) {
  layouts::ModelSpec m = layouts::model_preset(c.model);
  m.seq_length = 2048;
  return m;
}

layouts::ParallelConfig config_of(const Case& c, const layouts::ModelSpec& model) {
  layouts::ParallelConfig config{.world_size = c.world,
                                 .tensor_model_parallel_size = c.tp,
                                 .pipeline_model_parallel_size = c.pp,
                                 .context_parallel_size = c.cp,
                                 .expert_model_parallel_size = c.ep,
                                 .num_virtual_stages_per_pipeline_rank = c.vpp > 1 ? c.vpp : 0,
                                 .pipeline_model_parallel_layout = c.layout,
                                 .sequence_parallel = c.tp > 1,
                                 .micro_batch_size = c.mbs,
                                 .global_batch_size = c.gbs,
                                 .use_distributed_optimizer = c.dopt,
                                 .overlap_p2p_comm = c.vpp > 1 && c.pp == 2};
  config.overlap_grad_reduce = config.dp() * c.cp > 1;
  config.overlap_param_gather = c.dopt && config.overlap_grad_reduce;
  config.validate(model);
  return config;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"llama3-1b", 16, 2, 4, 1, 1, 1, 32, 2, "", true},
      {"llama3-1b", 16, 1, 4, 1, 1, 1, 16, 1, "Et*3|t*4|t*5|t*4L", false},
      {"llama3-1b", 16, 2, 2, 2, 1, 1, 16, 1, "", true},
      {"llama3-1b", 8, 1, 8, 1, 1, 1, 8, 1, "", false},
      {"gpt-1.3b", 16, 2, 2, 1, 1, 2, 64, 2, "", false},
      {"mixtral-small", 16, 2, 2, 1, 4, 1, 32, 1, "", true},
      {"tiny-deepseek-v3-full", 8, 1, 2, 1, 2, 1, 16, 1, "", true},
  };
  return all;
}

TEST(SimulationCache, ASimulationPricedThroughASharedCacheEqualsOnePricedFromScratch) {
  const Pricing pricing("2x8xH100");
  std::map<std::string, SimulationCache> caches;  // one per model, as a search has
  for (int round = 0; round < 2; ++round) {       // the second round finds every price cached
    for (const Case& c : cases()) {
      SimulationOptions shared;
      shared.cache = &caches[c.model];
      const layouts::ModelSpec model = model_of(c);
      const layouts::ParallelConfig config = config_of(c, model);
      const SimulationResult alone = simulate(model, config, *pricing.pricer);
      const SimulationResult cached = simulate(model, config, *pricing.pricer, shared);
      EXPECT_EQ(cached.step_time_s, alone.step_time_s) << c.model << " pp" << c.pp;
      EXPECT_EQ(cached.compute_s, alone.compute_s);
      EXPECT_EQ(cached.exposed_comm_s, alone.exposed_comm_s);
      EXPECT_EQ(cached.bubble_fraction, alone.bubble_fraction);
      EXPECT_EQ(cached.provenance_counts, alone.provenance_counts);
      for (int k = 0; k < kOpKindCount; ++k) {
        EXPECT_EQ(cached.kind_times[k].total_s, alone.kind_times[k].total_s);
        EXPECT_EQ(cached.kind_times[k].count, alone.kind_times[k].count);
      }
    }
  }
}

TEST(SimulationCache, TheBoundStaysBelowTheSimulatedStepCachedOrNot) {
  const Pricing pricing("2x8xH100");
  std::map<std::string, SimulationCache> caches;
  for (int round = 0; round < 2; ++round) {
    for (const Case& c : cases()) {
      SimulationOptions shared;
      shared.cache = &caches[c.model];
      const layouts::ModelSpec model = model_of(c);
      const layouts::ParallelConfig config = config_of(c, model);
      const double step = simulate(model, config, *pricing.pricer).step_time_s;
      const double passes = step_time_lower_bound(model, config, *pricing.pricer, {}, BoundTerms::kPasses);
      const double full = step_time_lower_bound(model, config, *pricing.pricer);
      const double cached_full = step_time_lower_bound(model, config, *pricing.pricer, shared);
      const double cached_passes =
          step_time_lower_bound(model, config, *pricing.pricer, shared, BoundTerms::kPasses);
      EXPECT_GT(passes, 0.0);
      EXPECT_LE(passes, full);
      EXPECT_LE(full, step) << c.model << " tp" << c.tp << " pp" << c.pp << " cp" << c.cp << " ep" << c.ep;
      EXPECT_NEAR(cached_full, full, 1e-12 * full);
      EXPECT_NEAR(cached_passes, passes, 1e-12 * passes);
    }
  }
}

// Layouts of one grid and stages that differ only in how the data-parallel ranks shard and overlap share
// every cached pass price but not their gradient sync: each cached bound, computed again from a cache the
// others filled, equals its own uncached one.
TEST(SimulationCache, TheCachedGradientSyncTellsShardingAndOverlapsApart) {
  const Pricing pricing("2x8xH100");
  const Case c{"llama3-1b", 16, 2, 2, 1, 1, 1, 32, 1, "", false};
  const layouts::ModelSpec model = model_of(c);
  layouts::ParallelConfig blocking = config_of(c, model);
  blocking.overlap_grad_reduce = false;  // the sync follows the last pass, so each kind shows in the bound
  std::vector<layouts::ParallelConfig> configs(4, blocking);
  configs[1].overlap_grad_reduce = true;
  configs[2].use_distributed_optimizer = true;
  configs[3].use_megatron_fsdp = true;
  configs[3].data_parallel_sharding_strategy = layouts::DataParallelSharding::kOptimGradsParams;
  SimulationCache cache;
  SimulationOptions shared;
  shared.cache = &cache;
  std::vector<double> uncached;
  for (const layouts::ParallelConfig& config : configs) {
    config.validate(model);
    uncached.push_back(step_time_lower_bound(model, config, *pricing.pricer));
  }
  for (std::size_t i = 1; i < uncached.size(); ++i) EXPECT_NE(uncached[i], uncached[0]) << i;
  for (int round = 0; round < 3; ++round)
    for (std::size_t i = 0; i < configs.size(); ++i)
      EXPECT_NEAR(step_time_lower_bound(model, configs[i], *pricing.pricer, shared), uncached[i],
                  1e-12 * uncached[i])
          << "config " << i << ", round " << round;
}

// 1F1B over 8 stages with 8 microbatches: the passes alone are 8 of the 15 pass slots the pipeline needs;
// with its fill and drain the bound comes within the p2p transfers of the simulated step.
TEST(SimulationCache, TheBoundHoldsThePipelinesFillAndDrain) {
  const Pricing pricing("1x8xH100");
  const Case c{"llama3-1b", 8, 1, 8, 1, 1, 1, 8, 1, "", false};
  const layouts::ModelSpec model = model_of(c);
  const layouts::ParallelConfig config = config_of(c, model);
  const double step = simulate(model, config, *pricing.pricer).step_time_s;
  const double bound = step_time_lower_bound(model, config, *pricing.pricer);
  EXPECT_GT(bound, 0.85 * step);
  EXPECT_LE(bound, step);
}

}  // namespace
}  // namespace megatune::planner
