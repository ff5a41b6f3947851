// The MoE layers' expert rows sized to what is routed: the row blocks grow only when a step routes more than
// any before and keep the saved rows of the micro-batches in flight; the expected and largest rows per rank
// (dropless and with Megatron's capacity factor); the capacity drop against a reference computed here; and
// the sizing pass's MoE memory at ep 8 against ep 1 for the same tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "executor/backend/sizing_backend.h"
#include "executor/cpu/cpu_backend.h"
#include "executor/model/moe_router.h"
#include "executor/model/moe_row_arena.h"
#include "executor/training/arena_sizing.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"

namespace megatune::executor {
namespace {

std::int64_t breakdown_bytes(const Backend& backend, const std::string& label) {
  for (const ArenaUse& u : backend.arena_breakdown())
    if (u.what == label) return u.bytes;
  return 0;
}

TEST(MoeRowArena, GrowsOnlyOnALargerStepAndKeepsTheSavedRows) {
  CpuBackend backend;
  backend.reserve_arena(1 << 12);
  MoeExpertRows rows;
  rows.expected = 4;
  rows.bound = 16;
  MoeRowArena arena(backend, DType::kFP32, /*entries=*/2, {3, 2}, {5}, rows);
  EXPECT_EQ(arena.capacity_rows(), 4);
  EXPECT_EQ(breakdown_bytes(backend, MoeRowArena::kSavedLabel), 2 * (3 + 2) * 4 * 4);
  EXPECT_EQ(breakdown_bytes(backend, MoeRowArena::kScratchLabel), 5 * 4 * 4);
  EXPECT_EQ(backend.arena_used_bytes(), 0);  // outside the arena
  // Entry 1's second buffer holds rows a step saved.
  std::vector<float> held(4 * 2);
  std::iota(held.begin(), held.end(), 1.0f);
  backend.upload(arena.saved(1, 1), held.data());
  EXPECT_FALSE(arena.reserve(3));
  EXPECT_FALSE(arena.reserve(4));
  EXPECT_EQ(arena.growths(), 0);
  EXPECT_TRUE(arena.reserve(7));  // more than ever before
  EXPECT_EQ(arena.capacity_rows(), 7);
  EXPECT_EQ(arena.growths(), 1);
  EXPECT_EQ(breakdown_bytes(backend, MoeRowArena::kSavedLabel), 2 * (3 + 2) * 7 * 4);
  EXPECT_EQ(backend.block_bytes(), (2 * 5 + 5) * 7 * 4);
  std::vector<float> got(7 * 2);
  backend.download(arena.saved(1, 1), got.data());
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 8), held);
  EXPECT_FALSE(arena.reserve(5));  // below the high-water mark: no growth
  EXPECT_EQ(arena.growths(), 1);
  EXPECT_TRUE(arena.reserve(16));
  EXPECT_THROW(arena.reserve(17), std::logic_error);  // past the dropless bound
}

TransformerConfig router_model(std::int64_t experts, int topk) {
  TransformerConfig c;
  c.hidden = 8;
  c.num_experts = experts;
  c.router.num_experts = experts;
  c.router.topk = topk;
  return c;
}

TEST(MoeExpertRows, DroplessIsTheBalancedCountBoundedByEveryChoiceOfEverySender) {
  TransformerConfig c = router_model(8, 2);
  const MoeExpertRows ep1 = moe_expert_rows(c, 4096, 1, 1);
  EXPECT_EQ(ep1.expected, 4096 * 2);
  EXPECT_EQ(ep1.bound, 4096 * 2);
  const MoeExpertRows ep8 = moe_expert_rows(c, 4096, 8, 1);
  EXPECT_EQ(ep8.expected, 4096 * 2);   // tokens * topk / ep from each of 8 ranks
  EXPECT_EQ(ep8.bound, 8 * 4096 * 1);  // one local expert: a token's copy at most once
  EXPECT_NE(ep8.rule.find("balanced"), std::string::npos) << ep8.rule;
  const MoeExpertRows etp2 = moe_expert_rows(c, 1024, 4, 2);
  EXPECT_EQ(etp2.expected, 2 * 1024 * 2);
  EXPECT_EQ(etp2.bound, 8 * 1024 * 2);
}

TEST(MoeExpertRows, WithACapacityFactorTheCapacityIsBothTheStartAndTheBound) {
  TransformerConfig c = router_model(8, 2);
  c.router.capacity_factor = 1.25;
  // ceil(4096 * 2 / 8 * 1.25) = 1280 rows per expert from each sender.
  const MoeExpertRows ep8 = moe_expert_rows(c, 4096, 8, 1);
  EXPECT_EQ(ep8.expected, 8 * 1 * 1280);
  EXPECT_EQ(ep8.bound, ep8.expected);
  const MoeExpertRows ep1 = moe_expert_rows(c, 4096, 1, 1);
  EXPECT_EQ(ep1.expected, 4096 * 2);  // 8 experts x 1280 > every choice
  c.router.capacity_factor = 0.5;
  EXPECT_EQ(moe_expert_rows(c, 4096, 1, 1).expected, 8 * 512);
}

// Megatron's drop (apply_router_token_dropping, drop policy "probs") recomputed here: each expert keeps its
// ceil(T * k / E * F) most probable (token, choice) pairs.
TEST(MoeCapacity, DropsTheLeastProbableTokensOverEachExpertsCapacity) {
  const std::int64_t T = 64, E = 4;
  const int k = 2;
  MoeRouterConfig c;
  c.num_experts = E;
  c.topk = k;
  c.capacity_factor = 0.75;
  c.load_balancing = LoadBalancingType::kNone;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits(static_cast<std::size_t>(T * E));
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t e = 0; e < E; ++e) logits[t * E + e] = normal(rng) + (e == 0 ? 1.5f : 0.0f);
  const MoeRouting r = route_tokens(logits.data(), T, T, c, nullptr);
  const std::int64_t capacity = static_cast<std::int64_t>(std::ceil(T * k / double(E) * 0.75));  // 24
  std::vector<std::uint8_t> expected(static_cast<std::size_t>(T * k), 1);
  for (std::int64_t e = 0; e < E; ++e) {
    std::vector<std::int64_t> pairs;
    for (std::int64_t i = 0; i < T * k; ++i)
      if (r.expert[i] == e) pairs.push_back(i);
    std::stable_sort(pairs.begin(), pairs.end(),
                     [&](std::int64_t a, std::int64_t b) { return r.prob[a] > r.prob[b]; });
    for (std::size_t j = static_cast<std::size_t>(capacity); j < pairs.size(); ++j) expected[pairs[j]] = 0;
    EXPECT_LE(r.tokens_per_expert[e], capacity);
  }
  EXPECT_EQ(r.kept, expected);
  EXPECT_LT(std::accumulate(r.kept.begin(), r.kept.end(), 0), T * k);  // expert 0 is over its capacity
  // What the layer sizes for: at most the capacity from each of its senders.
  TransformerConfig model = router_model(E, k);
  model.router = c;
  EXPECT_GE(moe_expert_rows(model, T, 1, 1).bound,
            std::accumulate(r.tokens_per_expert.begin(), r.tokens_per_expert.end(), std::int64_t{0}));
}

// The sizing pass's bytes of the MoE layers (every breakdown line naming MoE) on rank 0.
std::int64_t moe_bytes(const layouts::ModelSpec& spec, int ep) {
  layouts::ParallelConfig config;
  config.world_size = 8;
  config.expert_model_parallel_size = ep;
  config.micro_batch_size = 2;
  config.global_batch_size = 16;
  config.validate(spec);
  SizingBackend sizing;
  const RankArena arena = size_rank_arena(spec, config, TrainOptions{}, 0, sizing);
  std::int64_t bytes = 0;
  for (const ArenaUse& u : arena.breakdown)
    if (u.what.find("MoE") != std::string::npos) bytes += u.bytes;
  EXPECT_FALSE(arena.sizing_notes.empty());
  return bytes;
}

TEST(MoeSizing, ExpertParallelismDoesNotMultiplyTheActivationMemory) {
  layouts::ModelSpec spec = layouts::model_preset("tiny-mixtral");  // 8 experts, top-2
  spec.num_layers = 8;
  const std::int64_t ep1 = moe_bytes(spec, 1), ep8 = moe_bytes(spec, 8);
  EXPECT_GT(ep1, 0);
  EXPECT_LE(static_cast<double>(ep8), 1.1 * static_cast<double>(ep1))
      << ep8 << " bytes at ep8, " << ep1 << " at ep1";
}

}  // namespace
}  // namespace megatune::executor
