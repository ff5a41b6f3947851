// Planner search on constructed cases with a known better layout, priced from the embedded catalog.
#include "planner/search.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "base/user_error.h"
#include "cost_models/cluster_spec.h"
#include "cost_models/cost_model.h"
#include "planner/plan_report.h"

namespace megatune::planner {
namespace {

struct Fixture {
  cost_models::ClusterSpec cluster;
  std::unique_ptr<cost_models::CostModel> cost_model;
  std::unique_ptr<CostModelPricer> pricer;
  explicit Fixture(const std::string& spec) : cluster(cost_models::parse_cluster_spec(spec)) {
    cost_model = cost_models::CostModel::from_embedded(cluster);
    pricer = std::make_unique<CostModelPricer>(*cost_model);
  }
};

TEST(Search, KeepsTensorParallelismInsideTheNvlinkDomain) {
  Fixture f("2x4xH100");
  PlanRequest request;
  request.model = layouts::model_preset("llama3-8b");
  request.model.seq_length = 4096;
  request.world_size = 8;
  request.global_batch_size = 16;
  request.space.allow_tp_across_nodes = true;
  request.space.tp = {4, 8};
  request.space.pp = {1};
  request.space.cp = {1};
  request.space.micro_batch = {1};
  request.top_k = 5;
  PlanResult result = plan(request, *f.pricer);
  ASSERT_FALSE(result.ranked.empty());
  EXPECT_EQ(result.ranked[0].config.tp(), 4) << describe(result.ranked[0]);
  // Every tp 8 candidate (spanning two nodes) ranks below every tp 4 one.
  bool seen_tp8 = false;
  for (const PlanCandidate& c : result.ranked) {
    if (c.config.tp() == 8) seen_tp8 = true;
    if (seen_tp8) {
      EXPECT_EQ(c.config.tp(), 8);
    }
  }
  EXPECT_FALSE(result.why_winner.empty());
}

TEST(Search, HonoursAPinnedLayoutStringAndVirtualStages) {
  Fixture f("1x8xH100");
  PlanRequest request;
  request.model = layouts::model_preset("llama3-8b");
  request.model.seq_length = 4096;
  request.world_size = 8;
  request.global_batch_size = 64;
  request.top_k = 50;
  request.space.pipeline_layout = "Et*9|t*8|t*8|t*7L";
  PlanResult result = plan(request, *f.pricer);
  ASSERT_FALSE(result.ranked.empty());
  for (const PlanCandidate& c : result.ranked) {
    EXPECT_EQ(c.config.pipeline_model_parallel_layout, "Et*9|t*8|t*8|t*7L") << describe(c);
    EXPECT_EQ(c.config.pp() * c.vpp, 4) << describe(c);
  }
  PlanRequest pinned_vpp = request;
  pinned_vpp.space.pipeline_layout.clear();
  pinned_vpp.space.pp = {4};
  pinned_vpp.space.virtual_stages = 2;
  result = plan(pinned_vpp, *f.pricer);
  ASSERT_FALSE(result.ranked.empty());
  for (const PlanCandidate& c : result.ranked) EXPECT_EQ(c.vpp, 2) << describe(c);
}

TEST(Search, NoPipelineWhenTheModelFits) {
  Fixture f("1x8xH100");
  PlanRequest request;
  request.model = layouts::model_preset("llama3-1b");
  request.model.seq_length = 2048;
  request.world_size = 8;
  request.global_batch_size = 64;
  PlanResult result = plan(request, *f.pricer);
  ASSERT_FALSE(result.ranked.empty());
  EXPECT_EQ(result.ranked[0].config.pp(), 1) << describe(result.ranked[0]);
  EXPECT_GT(result.statistics.simulated, 0);
  EXPECT_GT(result.ranked[0].simulation.mfu, 0.2);
  EXPECT_LT(result.ranked[0].simulation.mfu, 0.8);
  for (std::size_t i = 1; i < result.ranked.size(); ++i)
    EXPECT_LE(result.ranked[i - 1].simulation.step_time_s, result.ranked[i].simulation.step_time_s);
}

TEST(Search, PrunesLayoutsThatDoNotFitAndSaysSoWhenNothingFits) {
  Fixture f("1x8xH100");
  PlanRequest request;
  request.model = layouts::model_preset("llama3-70b");
  request.model.seq_length = 4096;
  request.world_size = 8;
  request.global_batch_size = 8;
  try {
    plan(request, *f.pricer);
    FAIL() << "70B does not fit 8 GPUs with Adam";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
}

TEST(Search, AnInjectedMemoryModelJudgesOnlyWhatWouldBeSimulatedAndKeepsEveryWinnerInside) {
  Fixture f("1x8xH100");
  PlanRequest request;
  request.model = layouts::model_preset("llama3-1b");
  request.model.seq_length = 2048;
  request.world_size = 8;
  request.global_batch_size = 64;
  // A memory model under which only tensor-parallel layouts fit.
  std::atomic<int> asked{0};
  request.peak_memory_of = [&asked](const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                                    const MemoryOptions& options) {
    ++asked;
    MemoryEstimate e = peak_memory(model, config, options);
    if (config.tp() == 1) e.total_bytes = std::int64_t(1) << 50;
    return e;
  };
  const PlanResult result = plan(request, *f.pricer);
  ASSERT_FALSE(result.ranked.empty());
  for (const PlanCandidate& c : result.ranked) {
    EXPECT_GT(c.config.tp(), 1) << describe(c);
    EXPECT_LT(c.peak_memory_bytes, std::int64_t(1) << 50);
  }
  EXPECT_GT(result.statistics.out_of_memory, 0);
  // Sized: the simulated candidates and the ones refused on the way, not every enumerated layout.
  EXPECT_EQ(asked.load(), result.statistics.simulated + result.statistics.out_of_memory);
  EXPECT_LT(asked.load(), result.statistics.enumerated);

  request.peak_memory_of = [](const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                              const MemoryOptions& options) {
    MemoryEstimate e = peak_memory(model, config, options);
    e.total_bytes = std::int64_t(1) << 50;
    return e;
  };
  try {
    plan(request, *f.pricer);
    FAIL() << "nothing fits under that memory model";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
}

// A memory model that stops at the first pp rank past the capacity (a lower bound of the peak) still gets the
// nothing-fits error naming the exact smallest layout: the same message as a model that sizes every rank.
TEST(Search, NothingFitsNamesTheExactSmallestLayoutWhenSizingStopsEarly) {
  Fixture f("1x8xH100");
  PlanRequest request{.model = layouts::model_preset("llama3-1b"), .world_size = 8, .global_batch_size = 16};
  request.model.seq_length = 2048;
  request.space.micro_batch = {1, 2};
  auto scaled = [](MemoryEstimate e) {
    e.total_bytes *= 1000;  // nothing fits
    return e;
  };
  request.peak_memory_of = [&](const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                               const MemoryOptions& options) {
    return scaled(peak_memory(model, config, options));
  };
  std::string exact;
  try {
    plan(request, *f.pricer);
    FAIL() << "nothing fits";
  } catch (const UserError& e) {
    exact = e.what();
  }
  std::atomic<int> stopped{0};
  request.peak_memory_of = [&](const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                               const MemoryOptions& options) {
    if (options.stop_above_bytes == 0 || config.pp() == 1) return scaled(peak_memory(model, config, options));
    ++stopped;
    MemoryEstimate first = scaled(estimate_memory(model, config, 0, options));
    first.complete = false;
    return first;
  };
  try {
    plan(request, *f.pricer);
    FAIL() << "nothing fits";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), exact);
  }
  EXPECT_GT(stopped.load(), 0);
  EXPECT_NE(exact.find("the smallest"), std::string::npos) << exact;
}

// Past the time limit the search stops once a candidate has been simulated: it returns that best-so-far and
// counts what it did not reach; progress names both phases and ends at the total.
TEST(Search, ATimeLimitReturnsTheBestFoundSoFarAndProgressEndsAtTheTotal) {
  Fixture f("2x8xH100");
  PlanRequest request{.model = layouts::model_preset("llama3-8b"), .world_size = 16, .global_batch_size = 64};
  request.model.seq_length = 2048;
  std::vector<SearchProgress> seen;
  request.progress = [&seen](const SearchProgress& p) { seen.push_back(p); };
  const PlanResult full = plan(request, *f.pricer);
  EXPECT_FALSE(full.statistics.stopped_by_time_limit);
  EXPECT_EQ(full.statistics.not_reached, 0);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(std::string(seen.front().phase), "bounding");
  EXPECT_EQ(std::string(seen.back().phase), "simulating");
  EXPECT_EQ(seen.back().done, seen.back().total);
  EXPECT_DOUBLE_EQ(seen.back().best_step_s, full.ranked[0].simulation.step_time_s);
  for (const SearchProgress& p : seen) EXPECT_LE(p.done, p.total);

  request.progress = nullptr;
  request.time_limit_s = 1e-9;
  const PlanResult cut = plan(request, *f.pricer);
  EXPECT_TRUE(cut.statistics.stopped_by_time_limit);
  EXPECT_GT(cut.statistics.not_reached, 0);
  ASSERT_FALSE(cut.ranked.empty());
  EXPECT_GE(cut.statistics.simulated, 1);
  EXPECT_LT(cut.statistics.simulated, full.statistics.simulated);
  EXPECT_GE(cut.ranked[0].simulation.step_time_s, full.ranked[0].simulation.step_time_s);
}

// 14 layers never split evenly over 4 ranks x 2 chunks; lighter first/last stages (layout strings) still
// interleave them.
TEST(Search, InterleavesLayerCountsNoEvenSplitFitsWithLighterEndStages) {
  Fixture f("1x8xH100");
  PlanRequest request;
  request.model = layouts::model_preset("llama3-1b");
  request.model.num_layers = 14;
  request.model.seq_length = 2048;
  request.world_size = 8;
  request.global_batch_size = 32;
  request.space.pp = {4};
  request.space.micro_batch = {1};
  request.top_k = 1 << 20;
  const PlanResult result = plan(request, *f.pricer);
  bool found = false;
  for (const PlanCandidate& c : result.ranked) {
    if (c.vpp < 2) continue;
    EXPECT_FALSE(c.config.pipeline_model_parallel_layout.empty()) << c.layout;
    const layouts::PipelineLayout layout = c.config.resolved_pipeline_layout(request.model);
    const int middle = layout.stages()[1].num_decoder_layers;
    EXPECT_LE(layout.stages().front().num_decoder_layers, middle) << c.layout;
    EXPECT_LE(layout.stages().back().num_decoder_layers, middle) << c.layout;
    found |= c.layout == "Et|(tt|)*6tL" && c.vpp == 2;
  }
  EXPECT_TRUE(found) << "no Et|(tt|)*6tL at vpp 2 among " << result.ranked.size() << " candidates";
}

TEST(Search, EmitsLayoutStringsAndArgumentLists) {
  Fixture f("4x8xH100");
  PlanRequest request;
  request.model = layouts::model_preset("llama3-8b");
  request.model.seq_length = 4096;
  request.world_size = 32;
  request.global_batch_size = 64;
  request.space.tp = {8};
  request.space.pp = {4};
  request.space.cp = {1};
  request.space.micro_batch = {1};
  request.space.recompute = {layouts::RecomputeGranularity::kNone};
  request.space.distributed_optimizer = {true};
  request.space.sequence_parallel = {true};
  request.top_k = 50;
  PlanResult result = plan(request, *f.pricer);
  bool uneven = false, interleaved = false;
  for (const PlanCandidate& c : result.ranked) {
    EXPECT_EQ(c.config.pp(), 4);
    if (!c.config.pipeline_model_parallel_layout.empty()) uneven = true;
    if (c.vpp > 1) interleaved = true;
  }
  EXPECT_TRUE(uneven);
  EXPECT_TRUE(interleaved);
  const PlanCandidate& w = result.ranked[0];
  const std::string megatron = shell_join("python pretrain_gpt.py", megatron_arguments(request.model, w));
  EXPECT_NE(megatron.find("--tensor-model-parallel-size 8"), std::string::npos);
  EXPECT_NE(megatron.find("--pipeline-model-parallel-size 4"), std::string::npos);
  EXPECT_NE(megatron.find("--num-query-groups 8"), std::string::npos);
  EXPECT_NE(megatron.find("--use-distributed-optimizer"), std::string::npos);
  const std::string train = shell_join("megatune train", megatune_train_arguments(request.model, w));
  EXPECT_NE(train.find("--model llama3-8b"), std::string::npos);
  EXPECT_NE(format_plan_table(result).find("step (s)"), std::string::npos);
}

}  // namespace
}  // namespace megatune::planner
