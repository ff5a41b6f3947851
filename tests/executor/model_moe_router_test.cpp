// The MoE router on the host (executor/model/moe_router.h): each score function's and load-balancing loss's
// gradient against central finite differences, the top-k choice, the capacity drop and the aux loss's value.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "base/user_error.h"
#include "executor/model/moe_router.h"

namespace megatune::executor {
namespace {

constexpr std::int64_t kTokens = 6, kSeq = 3, kExperts = 5;

std::vector<float> random_values(std::int64_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

// L = sum over kept choices of weight * probability + aux_scale * (aux loss + z-loss).
double objective(const MoeRouting& r, const std::vector<float>& weights, float aux_scale) {
  double sum = aux_scale * (r.aux_loss + r.z_loss);
  for (std::size_t i = 0; i < r.prob.size(); ++i)
    sum += weights[i] * routed_prob(r, static_cast<std::int64_t>(i));
  return sum;
}

void check_gradient(const MoeRouterConfig& config) {
  std::vector<float> logits = random_values(kTokens * kExperts, 3, 1.0f);
  const std::vector<float> weights = random_values(kTokens * config.topk, 5, 1.0f);
  const float aux_scale = 0.7f;
  const MoeRouting routing = route_tokens(logits.data(), kTokens, kSeq, config, nullptr);
  std::vector<float> analytic(logits.size());
  route_tokens_backward(routing, config, weights.data(), aux_scale, analytic.data());
  const float step = 1e-3f;
  int compared = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float saved = logits[i];
    logits[i] = saved + step;
    const MoeRouting plus = route_tokens(logits.data(), kTokens, kSeq, config, nullptr);
    logits[i] = saved - step;
    const MoeRouting minus = route_tokens(logits.data(), kTokens, kSeq, config, nullptr);
    logits[i] = saved;
    // The objective is piecewise smooth: compare where the choice stayed the same.
    if (plus.expert != routing.expert || minus.expert != routing.expert || plus.kept != routing.kept ||
        minus.kept != routing.kept)
      continue;
    const double numeric =
        (objective(plus, weights, aux_scale) - objective(minus, weights, aux_scale)) / (2 * step);
    EXPECT_NEAR(numeric, analytic[i], 2e-3 + 1e-2 * std::fabs(numeric)) << "logit " << i;
    ++compared;
  }
  EXPECT_GT(compared, static_cast<int>(logits.size()) * 3 / 4);
}

MoeRouterConfig config(int topk) {
  MoeRouterConfig c;
  c.num_experts = kExperts;
  c.topk = topk;
  c.aux_loss_coeff = 0.1;
  return c;
}

TEST(MoeRouter, SoftmaxAfterTopKGradientMatchesFiniteDifferences) { check_gradient(config(2)); }

TEST(MoeRouter, PreSoftmaxGradientMatchesFiniteDifferences) {
  MoeRouterConfig c = config(2);
  c.pre_softmax = true;
  check_gradient(c);
}

TEST(MoeRouter, SigmoidGradientMatchesFiniteDifferences) {
  MoeRouterConfig c = config(3);
  c.score_function = RouterScoreFunction::kSigmoid;
  check_gradient(c);
  c.topk = 1;  // one choice: the sigmoid score itself, not normalized
  check_gradient(c);
}

TEST(MoeRouter, TopKScalingFactorScalesTheProbabilitiesAndTheirGradient) {
  // DeepSeek-V3's sigmoid routing with --moe-router-topk-scaling-factor 2.5 (and the softmax one), and a
  // pre-softmax flag, which the sigmoid scores ignore as Megatron's do.
  for (RouterScoreFunction score : {RouterScoreFunction::kSigmoid, RouterScoreFunction::kSoftmax}) {
    MoeRouterConfig c = config(3);
    c.score_function = score;
    c.pre_softmax = score == RouterScoreFunction::kSigmoid;
    check_gradient(c);
    const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.0f, 0.5f};
    const MoeRouting plain = route_tokens(logits.data(), 1, 1, c, nullptr);
    c.topk_scaling_factor = 2.5;
    check_gradient(c);
    const MoeRouting scaled = route_tokens(logits.data(), 1, 1, c, nullptr);
    EXPECT_EQ(scaled.expert, plain.expert);
    for (int j = 0; j < 3; ++j) EXPECT_NEAR(scaled.prob[j], 2.5f * plain.prob[j], 1e-6);
  }
}

TEST(MoeRouter, GroupLimitedRoutingPicksFromTheBestGroups) {
  // Four groups of two experts, one group kept, two experts from it: the group of the best pair (4 + 4)
  // wins over the one with the best single expert (5 + 0), so experts 6 and 7, not the global top 0 and 4.
  MoeRouterConfig c;
  c.num_experts = 8;
  c.topk = 2;
  c.num_groups = 4;
  c.group_topk = 1;
  const std::vector<float> logits = {5.0f, 0.0f, 0.0f, 0.0f, 4.9f, 0.0f, 4.0f, 4.0f};
  EXPECT_EQ(route_tokens(logits.data(), 1, 1, c, nullptr).expert, (std::vector<std::int32_t>{6, 7}));
  c.group_topk = 2;  // two groups, one expert each scores its group: groups 0 (5) and 2 (4.9)
  EXPECT_EQ(route_tokens(logits.data(), 1, 1, c, nullptr).expert, (std::vector<std::int32_t>{0, 4}));
  c.num_groups = c.group_topk = 0;
  EXPECT_EQ(route_tokens(logits.data(), 1, 1, c, nullptr).expert, (std::vector<std::int32_t>{0, 4}));
  // Sigmoid routing with groups: the choice is limited, the gradient formula is the same.
  MoeRouterConfig g = config(2);
  g.score_function = RouterScoreFunction::kSigmoid;
  g.num_groups = static_cast<int>(kExperts);  // groups of one expert, two of them kept
  g.group_topk = 2;
  check_gradient(g);
  for (const auto& [groups, group_topk] : std::vector<std::pair<int, int>>{{3, 1}, {4, 0}, {4, 3}}) {
    c.num_groups = groups;
    c.group_topk = group_topk;
    EXPECT_THROW(c.validate(8), UserError) << groups << " " << group_topk;
  }
}

TEST(MoeRouter, ZLossAndItsGradient) {
  MoeRouterConfig c = config(2);
  c.z_loss_coeff = 0.05;
  check_gradient(c);  // with the load-balancing loss
  c.aux_loss_coeff = 0.0;
  check_gradient(c);  // alone
  // Uniform logits x: logsumexp = x + log E for every token.
  const std::vector<float> logits(kTokens * kExperts, 0.5f);
  const double lse = 0.5 + std::log(static_cast<double>(kExperts));
  EXPECT_NEAR(route_tokens(logits.data(), kTokens, kSeq, c, nullptr).z_loss, 0.05 * lse * lse, 1e-6);
  // Two shards of the micro-batch: each its tokens' part, adding up to the whole one's.
  const MoeRouting half = route_tokens(logits.data(), kTokens / 2, kSeq, c, nullptr, {0, kTokens});
  EXPECT_NEAR(2 * half.z_loss, 0.05 * lse * lse, 1e-6);
  c.z_loss_coeff = -1;
  EXPECT_THROW(c.validate(kExperts), UserError);
}

TEST(MoeRouter, SequenceAuxLossGradientMatchesFiniteDifferences) {
  MoeRouterConfig c = config(2);
  c.load_balancing = LoadBalancingType::kSeqAuxLoss;
  check_gradient(c);
  c.score_function = RouterScoreFunction::kSigmoid;
  check_gradient(c);
}

TEST(MoeRouter, CapacityDropGradientMatchesFiniteDifferences) {
  MoeRouterConfig c = config(2);
  c.capacity_factor = 0.5;
  check_gradient(c);
}

TEST(MoeRouter, ChoosesTheLargestScoresInOrder) {
  MoeRouterConfig c = config(2);
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.0f, 0.5f};
  const MoeRouting r = route_tokens(logits.data(), 1, 1, c, nullptr);
  EXPECT_EQ(r.expert, (std::vector<std::int32_t>{1, 3}));
  const double p1 = 1.0 / (1.0 + std::exp(-1.0));  // softmax over the two chosen logits
  EXPECT_NEAR(r.prob[0], p1, 1e-6);
  EXPECT_NEAR(r.prob[1], 1.0 - p1, 1e-6);
  EXPECT_EQ(r.tokens_per_expert, (std::vector<std::int64_t>{0, 1, 0, 1, 0}));
}

TEST(MoeRouter, ExpertBiasSteersTheChoiceButNotTheProbabilities) {
  MoeRouterConfig c = config(1);
  c.score_function = RouterScoreFunction::kSigmoid;
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.0f, 0.5f};
  const std::vector<float> bias = {0.0f, 0.0f, 0.0f, 0.0f, 1.0f};
  const MoeRouting r = route_tokens(logits.data(), 1, 1, c, bias.data());
  EXPECT_EQ(r.expert, (std::vector<std::int32_t>{4}));
  EXPECT_NEAR(r.prob[0], 1.0 / (1.0 + std::exp(-0.5)), 1e-6);
}

TEST(MoeRouter, CapacityKeepsTheMostProbableTokensOfEachExpert) {
  MoeRouterConfig c = config(1);
  c.num_experts = 2;
  c.capacity_factor = 1.0;  // capacity ceil(4 * 1 / 2) = 2 tokens per expert
  c.aux_loss_coeff = 0.0;
  c.pre_softmax = true;  // probabilities over both experts (top-1 after the softmax would give 1 to all)
  // Every token prefers expert 0, with rising confidence.
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, 0.0f, 3.0f, 0.0f, 4.0f, 0.0f};
  const MoeRouting r = route_tokens(logits.data(), 4, 4, c, nullptr);
  EXPECT_EQ(r.kept, (std::vector<std::uint8_t>{0, 0, 1, 1}));
  EXPECT_EQ(r.tokens_per_expert, (std::vector<std::int64_t>{2, 0}));
  EXPECT_EQ(routed_prob(r, 0), 0.0f);
  EXPECT_NEAR(routed_prob(r, 3), 1.0 / (1.0 + std::exp(-4.0)), 1e-6);
}

TEST(MoeRouter, AuxLossOfUniformScoresIsItsCoefficient) {
  // P_e = T / E for every expert, and the k chosen experts' counts sum to T * k: the loss is the coefficient.
  for (LoadBalancingType type : {LoadBalancingType::kAuxLoss, LoadBalancingType::kSeqAuxLoss}) {
    MoeRouterConfig c = config(2);
    c.load_balancing = type;
    const std::vector<float> logits(kTokens * kExperts, 0.25f);
    EXPECT_NEAR(route_tokens(logits.data(), kTokens, kSeq, c, nullptr).aux_loss, 0.1, 1e-7);
  }
  MoeRouterConfig none = config(2);
  none.load_balancing = LoadBalancingType::kNone;
  const std::vector<float> logits = random_values(kTokens * kExperts, 1, 1.0f);
  const MoeRouting r = route_tokens(logits.data(), kTokens, kSeq, none, nullptr);
  EXPECT_EQ(r.aux_loss, 0.0);
  EXPECT_TRUE(r.aux_loss_grad.empty());
}

// Sequence parallelism: two shards of the micro-batch (rows [0, 2) and [2, 6): the first sequence is split),
// their counts summed by the reduce, give losses that add up to the whole micro-batch's and the whole's
// gradient row for row.
TEST(MoeRouter, ShardedLoadBalancingLossAddsUpToTheWholeMicroBatch) {
  for (LoadBalancingType type : {LoadBalancingType::kAuxLoss, LoadBalancingType::kSeqAuxLoss}) {
    SCOPED_TRACE(type == LoadBalancingType::kAuxLoss ? "aux_loss" : "seq_aux_loss");
    MoeRouterConfig c = config(2);
    c.load_balancing = type;
    const std::vector<float> logits = random_values(kTokens * kExperts, 11, 1.0f);
    const MoeRouting whole = route_tokens(logits.data(), kTokens, kSeq, c, nullptr);
    const std::int64_t first[2] = {0, 2}, rows[2] = {2, kTokens - 2};
    auto route_shard = [&](int i, const AuxLossCountsReduce& reduce) {
      return route_tokens(logits.data() + first[i] * kExperts, rows[i], kSeq, c, nullptr, {first[i], kTokens},
                          reduce);
    };
    std::vector<double> own[2];
    for (int i = 0; i < 2; ++i) route_shard(i, [&](std::vector<double>& counts) { own[i] = counts; });
    double loss = 0.0;
    for (int i = 0; i < 2; ++i) {
      const MoeRouting part = route_shard(i, [&](std::vector<double>& counts) {
        for (std::size_t j = 0; j < counts.size(); ++j) counts[j] += own[1 - i][j];
      });
      loss += part.aux_loss;
      for (std::int64_t j = 0; j < rows[i] * kExperts; ++j)
        EXPECT_NEAR(part.aux_loss_grad[j], whole.aux_loss_grad[first[i] * kExperts + j], 1e-7);
    }
    EXPECT_GT(whole.aux_loss, 0.0);
    EXPECT_NEAR(loss, whole.aux_loss, 1e-7);
  }
}

TEST(MoeRouter, ExpertBiasMovesTowardsTheMeanLoad) {
  std::vector<float> bias = {0.5f, 0.0f, -0.25f, 0.0f};
  update_expert_bias({10, 2, 4, 0}, 0.125, bias);  // mean 4
  EXPECT_EQ(bias, (std::vector<float>{0.375f, 0.125f, -0.25f, 0.125f}));
}

TEST(MoeRouter, BadFlagsAreUserErrors) {
  EXPECT_THROW(parse_router_score_function("tanh"), UserError);
  EXPECT_THROW(parse_load_balancing_type("sinkhorn"), UserError);
  MoeRouterConfig c = config(6);
  EXPECT_THROW(c.validate(kExperts), UserError);
  c = config(2);
  c.enable_expert_bias = true;  // softmax
  EXPECT_THROW(c.validate(kExperts), UserError);
}

// A micro-batch long enough for routing's per-token work to run in chunks on several threads (the last
// chunk partial): every token's choice is the top-k of its logits with the softmax of the chosen ones, and
// the aux loss and its gradient match a direct evaluation of Megatron's formula.
TEST(MoeRouter, ManyTokensAreRoutedAsOneByOne) {
  const std::int64_t T = 5000, E = 8;
  MoeRouterConfig c = config(2);
  c.num_experts = E;
  c.aux_loss_coeff = 1e-2;
  const std::vector<float> logits = random_values(T * E, 17, 1.0f);
  const MoeRouting r = route_tokens(logits.data(), T, T, c, nullptr);
  std::vector<double> counts(E, 0.0), summed(E, 0.0);
  std::vector<std::vector<double>> scores(T, std::vector<double>(E));
  for (std::int64_t t = 0; t < T; ++t) {
    const float* z = &logits[t * E];
    int first = 0, second = -1;
    for (int e = 1; e < E; ++e)
      if (z[e] > z[first]) first = e;
    for (int e = 0; e < E; ++e)
      if (e != first && (second < 0 || z[e] > z[second])) second = e;
    ASSERT_EQ(r.expert[t * 2], first) << "token " << t;
    ASSERT_EQ(r.expert[t * 2 + 1], second) << "token " << t;
    const double p_first = 1.0 / (1.0 + std::exp(double(z[second]) - z[first]));
    ASSERT_NEAR(r.prob[t * 2], p_first, 1e-6) << "token " << t;
    double total = 0;
    for (int e = 0; e < E; ++e) total += scores[t][e] = std::exp(double(z[e]));
    for (int e = 0; e < E; ++e) summed[e] += scores[t][e] /= total;
    counts[first] += 1, counts[second] += 1;
  }
  const double scale = c.aux_loss_coeff * E / (2.0 * double(T) * double(T));
  double aux = 0;
  for (int e = 0; e < E; ++e) aux += scale * summed[e] * counts[e];
  EXPECT_NEAR(r.aux_loss, aux, 1e-6 * aux);
  // d aux / d z[t, e] = s_e (g_e - <s, g>), g = scale * counts.
  for (std::int64_t t : {std::int64_t(0), std::int64_t(1023), std::int64_t(1024), std::int64_t(4999)}) {
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += scores[t][e] * scale * counts[e];
    for (int e = 0; e < E; ++e) {
      const double want = scores[t][e] * (scale * counts[e] - dot);
      // float scores and g: relative to the terms' size, s_e * scale * T (the difference cancels).
      EXPECT_NEAR(r.aux_loss_grad[t * E + e], want, 1e-5 * scores[t][e] * scale * double(T))
          << "token " << t << " expert " << e;
    }
  }
}

}  // namespace
}  // namespace megatune::executor
