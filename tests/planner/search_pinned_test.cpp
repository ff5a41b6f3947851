// Megatron flags that pin the search: --dp fixes the data-parallel size, the split flags
// (--decoder-first/last-pipeline-num-layers, --account-for-embedding/loss-in-pipeline-split) are the only
// pipeline split tried (with virtual stages where they divide), and the dispatcher, the microbatch group
// size and the rank order reach every candidate and its price; contradicting pins get one clear line.
#include <gtest/gtest.h>

#include "base/user_error.h"
#include "cost_models/cluster_spec.h"
#include "cost_models/cost_model.h"
#include "planner/search.h"
#include "planner/simulator.h"

namespace megatune::planner {
namespace {

struct Pricing {
  std::unique_ptr<cost_models::CostModel> cost_model;
  std::unique_ptr<CostModelPricer> pricer;
  Pricing() {
    cost_model = cost_models::CostModel::from_embedded(cost_models::parse_cluster_spec("1x8xH100"));
    pricer = std::make_unique<CostModelPricer>(*cost_model);
  }
};

// A preset (llama3-1b's shape at `layers` layers by default) on 8 GPUs, global batch 32, every candidate
// ranked.
PlanRequest small_request(int layers, const char* preset = "llama3-1b") {
  PlanRequest request;
  request.model = layouts::model_preset(preset);
  if (layers > 0) request.model.num_layers = layers;
  request.model.seq_length = 2048;
  request.world_size = 8;
  request.global_batch_size = 32;
  request.space.micro_batch = {1, 2};
  request.top_k = 1 << 20;
  request.threads = 2;
  return request;
}

// The UserError plan() throws for `request` ("" when it plans).
std::string refusal(const PlanRequest& request, const Pricing& pricing) {
  try {
    plan(request, *pricing.pricer);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// Decoder layers held by pp rank `pp_rank` over its chunks.
int rank_layers(const layouts::ModelSpec& model, const layouts::ParallelConfig& config, int pp_rank) {
  int layers = 0;
  const auto resolved = config.resolved_pipeline_layout(model);  // the stages point into it
  for (const layouts::PipelineStage* stage : resolved.stages_of_rank(pp_rank))
    layers += stage->num_decoder_layers;
  return layers;
}

TEST(SearchPinned, DataParallelSizeFixesDp) {
  const Pricing pricing;
  PlanRequest request = small_request(16);
  request.space.dp = 2;
  const PlanResult result = plan(request, *pricing.pricer);
  ASSERT_FALSE(result.ranked.empty());
  for (const PlanCandidate& c : result.ranked) EXPECT_EQ(c.config.dp(), 2) << describe(c);
  request.space.dp = 3;  // does not divide 8 GPUs
  const std::string refused = refusal(request, pricing);
  EXPECT_NE(refused.find("--data-parallel-size 3"), std::string::npos) << refused;
}

TEST(SearchPinned, DecoderFirstAndLastStageLayersAreTheOnlySplitTried) {
  const Pricing pricing;
  PlanRequest request = small_request(32);
  request.space.first_stage_layers = 6;
  request.space.last_stage_layers = 6;
  const PlanResult result = plan(request, *pricing.pricer);
  ASSERT_FALSE(result.ranked.empty());
  bool interleaved = false;
  for (const PlanCandidate& c : result.ranked) {
    EXPECT_EQ(c.config.decoder_first_pipeline_num_layers, 6);
    EXPECT_EQ(c.config.decoder_last_pipeline_num_layers, 6);
    EXPECT_TRUE(c.config.pipeline_model_parallel_layout.empty()) << c.layout;
    EXPECT_EQ(c.config.pp(), 4) << describe(c);  // 20 middle layers split evenly over 2 ranks only
    EXPECT_EQ(rank_layers(request.model, c.config, 0), 6) << c.layout;
    EXPECT_EQ(rank_layers(request.model, c.config, 3), 6) << c.layout;
    interleaved |= c.vpp == 2;
  }
  EXPECT_TRUE(interleaved) << "6 and 10 layers per rank split over 2 chunks";

  request.space.pipeline_layout = "Et*16|t*16L";
  const std::string refused = refusal(request, pricing);
  EXPECT_NE(refused.find("--pipeline-model-parallel-layout already places every layer"), std::string::npos)
      << refused;
}

TEST(SearchPinned, EmbeddingAndLossAccountingIsTheOnlySplitTried) {
  const Pricing pricing;
  PlanRequest request = small_request(30);  // 30 + E + L = 32 units
  request.space.account_for_embedding = true;
  request.space.account_for_loss = true;
  request.space.pp = {4};
  const PlanResult result = plan(request, *pricing.pricer);
  ASSERT_FALSE(result.ranked.empty());
  for (const PlanCandidate& c : result.ranked) {
    EXPECT_TRUE(c.config.account_for_embedding_in_pipeline_split);
    EXPECT_TRUE(c.config.account_for_loss_in_pipeline_split);
    EXPECT_EQ(rank_layers(request.model, c.config, 0), 7) << c.layout;
    EXPECT_EQ(rank_layers(request.model, c.config, 1), 8) << c.layout;
    EXPECT_EQ(rank_layers(request.model, c.config, 3), 7) << c.layout;
  }
}

TEST(SearchPinned, DispatcherGroupSizeAndRankOrderReachEveryCandidateAndItsPrice) {
  const Pricing pricing;
  PlanRequest request = small_request(0, "mixtral-small");
  request.space.tp = {2};
  request.space.ep = {4};
  request.space.micro_batch = {1};
  request.space.moe_dispatcher = layouts::MoeDispatcher::kAllGather;
  request.space.rank_order = layouts::RankOrder::kTpCpEpPpDp;
  request.space.microbatch_group_size = 4;
  const PlanResult result = plan(request, *pricing.pricer);
  ASSERT_FALSE(result.ranked.empty());
  bool interleaved = false;
  for (const PlanCandidate& c : result.ranked) {
    EXPECT_EQ(c.config.moe_token_dispatcher_type, layouts::MoeDispatcher::kAllGather);
    EXPECT_EQ(c.config.rank_order, layouts::RankOrder::kTpCpEpPpDp);
    if (c.vpp > 1) {
      interleaved = true;
      EXPECT_EQ(c.config.micro_batch_group_size(), 4) << describe(c);
    }
  }
  EXPECT_TRUE(interleaved);
  const PlanCandidate& winner = result.ranked.front();
  layouts::ParallelConfig alltoall = winner.config;
  alltoall.moe_token_dispatcher_type = layouts::MoeDispatcher::kAllToAll;
  EXPECT_NE(simulate(request.model, alltoall, *pricing.pricer).step_time_s, winner.simulation.step_time_s);
}

}  // namespace
}  // namespace megatune::planner
