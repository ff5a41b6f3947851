// Recompute plan: Megatron's uniform groups and block layers over a chunk's layers.
#include "layouts/recompute_plan.h"

#include <gtest/gtest.h>

namespace megatune::layouts {
namespace {

RecomputeSettings full(RecomputeMethod method, int n) { return {RecomputeGranularity::kFull, method, n}; }

std::vector<std::vector<int>> units_of(const RecomputePlan& plan) {
  std::vector<std::vector<int>> out;
  for (const RecomputeUnit& u : plan.units) out.push_back(u.layers);
  return out;
}

const std::vector<int> kSix = {4, 5, 6, 7, 8, 9};  // a chunk holding global layers 4..9

TEST(RecomputePlan, UniformOneIsEveryLayerAlone) {
  const RecomputePlan plan = plan_recompute(full(RecomputeMethod::kUniform, 1), kSix);
  EXPECT_EQ(units_of(plan), (std::vector<std::vector<int>>{{4}, {5}, {6}, {7}, {8}, {9}}));
  for (int l : kSix) EXPECT_EQ(plan.at(l), LayerRecompute::kUnitLast) << l;
  EXPECT_EQ(plan.recomputed_count(), 6);
  EXPECT_EQ(plan.largest_unit(), 1);
}

TEST(RecomputePlan, UniformGroupsThatDivideTheChunk) {
  const RecomputePlan two = plan_recompute(full(RecomputeMethod::kUniform, 2), kSix);
  EXPECT_EQ(units_of(two), (std::vector<std::vector<int>>{{4, 5}, {6, 7}, {8, 9}}));
  EXPECT_EQ(two.at(4), LayerRecompute::kUnitInner);
  EXPECT_EQ(two.at(5), LayerRecompute::kUnitLast);
  ASSERT_NE(two.unit_ending_at(7), nullptr);
  EXPECT_EQ(two.unit_ending_at(7)->layers, (std::vector<int>{6, 7}));
  EXPECT_EQ(two.unit_ending_at(6), nullptr);
  EXPECT_EQ(two.unit_of(6), two.unit_ending_at(7));
  const RecomputePlan three = plan_recompute(full(RecomputeMethod::kUniform, 3), kSix);
  EXPECT_EQ(units_of(three), (std::vector<std::vector<int>>{{4, 5, 6}, {7, 8, 9}}));
  EXPECT_EQ(three.largest_unit(), 3);
}

TEST(RecomputePlan, UniformGroupsThatDoNotDivideKeepTheRestAsALastGroup) {
  const std::vector<int> five = {0, 1, 2, 3, 4};
  EXPECT_EQ(units_of(plan_recompute(full(RecomputeMethod::kUniform, 2), five)),
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4}}));
  EXPECT_EQ(units_of(plan_recompute(full(RecomputeMethod::kUniform, 3), five)),
            (std::vector<std::vector<int>>{{0, 1, 2}, {3, 4}}));
  // More layers per unit than the chunk holds: one unit of what is there.
  EXPECT_EQ(units_of(plan_recompute(full(RecomputeMethod::kUniform, 8), five)),
            (std::vector<std::vector<int>>{{0, 1, 2, 3, 4}}));
}

TEST(RecomputePlan, BlockRecomputesTheFirstLayersAloneAndKeepsTheRest) {
  const RecomputePlan two = plan_recompute(full(RecomputeMethod::kBlock, 2), kSix);
  EXPECT_EQ(units_of(two), (std::vector<std::vector<int>>{{4}, {5}}));
  EXPECT_EQ(two.at(4), LayerRecompute::kUnitLast);
  EXPECT_EQ(two.at(5), LayerRecompute::kUnitLast);
  for (int l : {6, 7, 8, 9}) EXPECT_EQ(two.at(l), LayerRecompute::kKept) << l;
  EXPECT_EQ(two.recomputed_count(), 2);
  // N >= the chunk's layers: all of them.
  for (int n : {6, 9}) {
    const RecomputePlan all = plan_recompute(full(RecomputeMethod::kBlock, n), kSix);
    EXPECT_EQ(all.recomputed_count(), 6) << n;
    EXPECT_EQ(all.largest_unit(), 1) << n;
  }
}

TEST(RecomputePlan, NoFullRecomputationKeepsEveryLayer) {
  for (RecomputeGranularity g : {RecomputeGranularity::kNone, RecomputeGranularity::kSelective}) {
    const RecomputePlan plan = plan_recompute({g, RecomputeMethod::kNone, 0}, kSix);
    EXPECT_TRUE(plan.units.empty());
    for (int l : kSix) EXPECT_FALSE(plan.recomputed(l));
  }
}

// VPP: each chunk is planned on its own layers (Megatron's TransformerBlock per virtual stage).
TEST(RecomputePlan, EachVirtualChunkIsPlannedOnItsOwnLayers) {
  const PipelineLayout layout = PipelineLayout::parse("Ettt|ttt|ttt|tttL", 2);
  const std::vector<const PipelineStage*> rank0 = layout.stages_of_rank(0);
  ASSERT_EQ(rank0.size(), 2u);
  const RecomputePlan chunk1 = plan_recompute(full(RecomputeMethod::kUniform, 2), *rank0[1]);
  EXPECT_EQ(units_of(chunk1), (std::vector<std::vector<int>>{{6, 7}, {8}}));
  const RecomputePlan block = plan_recompute(full(RecomputeMethod::kBlock, 1), *rank0[1]);
  EXPECT_EQ(units_of(block), (std::vector<std::vector<int>>{{6}}));
  EXPECT_FALSE(block.recomputed(7));
  EXPECT_FALSE(block.recomputed(0));  // another chunk's layer
}

TEST(RecomputePlan, MtpLayersAreCheckpointedAloneUnderUniformAndNotUnderBlock) {
  const RecomputePlan uniform = plan_recompute(full(RecomputeMethod::kUniform, 1), {0, 1}, {-3, -4});
  EXPECT_EQ(units_of(uniform), (std::vector<std::vector<int>>{{0}, {1}, {-3}, {-4}}));
  const RecomputePlan block = plan_recompute(full(RecomputeMethod::kBlock, 4), {0, 1}, {-3});
  EXPECT_EQ(units_of(block), (std::vector<std::vector<int>>{{0}, {1}}));
  EXPECT_FALSE(block.recomputed(-3));
}

// The planner's per-layer rule agrees with the plan for every method, unit size and chunk size.
TEST(RecomputePlan, ThePerLayerRuleAgreesWithThePlan) {
  for (RecomputeMethod method : {RecomputeMethod::kUniform, RecomputeMethod::kBlock})
    for (int n = 1; n <= 7; ++n)
      for (int count = 1; count <= 9; ++count) {
        std::vector<int> layers;
        for (int i = 0; i < count; ++i) layers.push_back(10 + i);
        const RecomputeSettings settings = full(method, n);
        const RecomputePlan plan = plan_recompute(settings, layers, {-3});
        for (int i = 0; i < count; ++i)
          EXPECT_EQ(decoder_layer_recompute(settings, i, count), plan.at(10 + i))
              << n << " " << count << " " << i;
        EXPECT_EQ(mtp_layer_recompute(settings), plan.at(-3));
      }
}

}  // namespace
}  // namespace megatune::layouts
