// MoE routing on the host: score functions, top-k, capacity drop, load-balancing losses and their backward.
#include "executor/model/moe_router.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <thread>

#include "base/user_error.h"

namespace megatune::executor {
namespace {

constexpr double kSigmoidNormEps = 1e-20;  // Megatron's epsilon in the sigmoid probabilities' normalization

// Runs body(first, end) over [0, n) in chunks of kTokenChunk on up to kRouterThreads threads, serially when
// n is small. Callers only compute per-token results in it (every reduction over tokens stays serial, in
// token order), so the results are bitwise the same for any split. The load-balancing loss uses it (1.3 ms
// for 8192 tokens x 8 experts on one core, computed while the GPU runs the experts).
constexpr std::int64_t kTokenChunk = 1024;
constexpr unsigned kRouterThreads = 8;

void parallel_tokens(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body) {
  const std::int64_t chunks = (n + kTokenChunk - 1) / kTokenChunk;
  const unsigned workers = static_cast<unsigned>(std::min<std::int64_t>(
      chunks, std::min(kRouterThreads, std::max(1u, std::thread::hardware_concurrency()))));
  if (workers <= 1) {
    body(0, n);
    return;
  }
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < workers; ++w)
    threads.emplace_back([&, w] {
      for (std::int64_t c = w; c < chunks; c += workers)
        body(c * kTokenChunk, std::min(n, (c + 1) * kTokenChunk));
    });
  for (std::thread& t : threads) t.join();
}

// Each exponential once (routing runs on the host between the router GEMM and the permutation, so its cost
// is GPU idle time): held in a small stack buffer, or recomputed past kStackExperts.
constexpr std::int64_t kStackExperts = 256;

void softmax(const float* x, std::int64_t n, float* out) {
  const float top = *std::max_element(x, x + n);
  double sum = 0.0, exps[kStackExperts];
  for (std::int64_t i = 0; i < n; ++i) {
    const double e = std::exp(static_cast<double>(x[i] - top));
    if (i < kStackExperts) exps[i] = e;
    sum += e;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const double e = i < kStackExperts ? exps[i] : std::exp(static_cast<double>(x[i] - top));
    out[i] = static_cast<float>(e / sum);
  }
}

float sigmoid(float x) { return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x)))); }

// The k largest of scores (n), in descending order; ties go to the lower index. Insertion into the k best
// so far (k is small), without allocating.
void top_k(const float* scores, std::int64_t n, int k, std::int32_t* out) {
  int filled = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    // Strictly greater than the last kept one: an equal later index ranks below it.
    if (filled == k && !(scores[i] > scores[out[k - 1]])) continue;
    int at = filled < k ? filled++ : k - 1;
    while (at > 0 && scores[i] > scores[out[at - 1]]) {
      out[at] = out[at - 1];
      --at;
    }
    out[at] = static_cast<std::int32_t>(i);
  }
}

// The k experts of one token's routing scores (E) in descending order, as Megatron's topk: over all experts,
// or group-limited (DeepSeek-V3's node-limited routing, Megatron's group_limited_topk): each of num_groups
// groups of consecutive experts scores the sum of its topk / group_topk best, the group_topk best groups
// are kept, and the k come from their experts only.
void select_top_k(const float* scores, const MoeRouterConfig& c, std::int32_t* out) {
  const std::int64_t E = c.num_experts;
  const int k = c.topk;
  if (c.num_groups <= 0) {
    top_k(scores, E, k, out);
    return;
  }
  const int groups = c.num_groups, per_group = static_cast<int>(E / groups), best = k / c.group_topk;
  thread_local std::vector<float> group_score, masked;
  thread_local std::vector<std::int32_t> chosen, kept_groups;
  group_score.resize(static_cast<std::size_t>(groups));
  chosen.resize(static_cast<std::size_t>(best));
  for (int g = 0; g < groups; ++g) {
    top_k(scores + static_cast<std::int64_t>(g) * per_group, per_group, best, chosen.data());
    double sum = 0.0;
    for (int j = 0; j < best; ++j) sum += scores[static_cast<std::int64_t>(g) * per_group + chosen[j]];
    group_score[g] = static_cast<float>(sum);
  }
  kept_groups.resize(static_cast<std::size_t>(c.group_topk));
  top_k(group_score.data(), groups, c.group_topk, kept_groups.data());
  masked.assign(static_cast<std::size_t>(E), -INFINITY);
  for (std::int32_t g : kept_groups)
    for (int e = 0; e < per_group; ++e) masked[g * per_group + e] = scores[g * per_group + e];
  top_k(masked.data(), E, k, out);
}

// y = J^T g of the softmax s (n): s * (g - <s, g>), accumulated into y.
void softmax_backward(const float* s, const float* g, std::int64_t n, float* y) {
  double dot = 0.0;
  for (std::int64_t i = 0; i < n; ++i) dot += static_cast<double>(s[i]) * g[i];
  for (std::int64_t i = 0; i < n; ++i) y[i] += static_cast<float>(s[i] * (g[i] - dot));
}

// The experts and probabilities of one token (row of E logits).
void choose(const float* logits, const MoeRouterConfig& c, const float* expert_bias, std::int32_t* expert,
            float* prob) {
  const std::int64_t E = c.num_experts;
  const int k = c.topk;
  if (k == 2 && c.score_function == RouterScoreFunction::kSoftmax && !c.pre_softmax && c.num_groups <= 0) {
    // Mixtral's routing, the common case, in one pass: the two largest logits (ties to the lower index, as
    // top_k), then the softmax over the pair, as softmax() computes it.
    std::int32_t a = 0, b = -1;
    for (std::int64_t i = 1; i < E; ++i) {
      if (logits[i] > logits[a]) {
        b = a;
        a = static_cast<std::int32_t>(i);
      } else if (b < 0 || logits[i] > logits[b]) {
        b = static_cast<std::int32_t>(i);
      }
    }
    expert[0] = a;
    expert[1] = b;
    const double second = std::exp(static_cast<double>(logits[b] - logits[a])), sum = 1.0 + second;
    prob[0] = static_cast<float>(1.0 / sum);
    prob[1] = static_cast<float>(second / sum);
    return;
  }
  thread_local std::vector<float> scores;
  scores.resize(static_cast<std::size_t>(std::max<std::int64_t>(E, k)));
  if (c.score_function == RouterScoreFunction::kSoftmax) {
    if (c.pre_softmax) {
      softmax(logits, E, scores.data());
      select_top_k(scores.data(), c, expert);
      for (int j = 0; j < k; ++j) prob[j] = scores[expert[j]];
    } else {
      select_top_k(logits, c, expert);
      for (int j = 0; j < k; ++j) scores[j] = logits[expert[j]];
      softmax(scores.data(), k, prob);
    }
    return;
  }
  for (std::int64_t e = 0; e < E; ++e) scores[e] = sigmoid(logits[e]);
  std::vector<float> for_choice = scores;
  if (expert_bias != nullptr)
    for (std::int64_t e = 0; e < E; ++e) for_choice[e] += expert_bias[e];
  select_top_k(for_choice.data(), c, expert);
  double sum = 0.0;
  for (int j = 0; j < k; ++j) sum += scores[expert[j]];
  for (int j = 0; j < k; ++j)
    prob[j] = k > 1 ? static_cast<float>(scores[expert[j]] / (sum + kSigmoidNormEps)) : scores[expert[j]];
}

// Megatron's apply_router_token_dropping (drop policy "probs"): each expert keeps its `capacity` most
// probable tokens, capacity = ceil(T * k / E * factor); probabilities are not renormalized.
void drop_over_capacity(MoeRouting& r, const MoeRouterConfig& c) {
  const std::int64_t T = r.tokens, E = c.num_experts;
  const int k = c.topk;
  const std::int64_t capacity = c.expert_capacity(T);
  if (capacity >= T) return;
  std::vector<std::vector<std::int64_t>> slots(static_cast<std::size_t>(E));  // (token * k + j) per expert
  for (std::int64_t i = 0; i < T * k; ++i) slots[r.expert[i]].push_back(i);
  for (std::vector<std::int64_t>& s : slots) {
    if (static_cast<std::int64_t>(s.size()) <= capacity) continue;
    std::stable_sort(s.begin(), s.end(),
                     [&](std::int64_t a, std::int64_t b) { return r.prob[a] > r.prob[b]; });
    for (std::size_t i = static_cast<std::size_t>(capacity); i < s.size(); ++i) r.kept[s[i]] = 0;
  }
}

// The scores the load-balancing loss differentiates (T, E): softmax of the logits, or the sigmoid scores
// normalized per token; and the gradient of the score with respect to the logits applied to g (one row).
void aux_scores(const float* logits, const MoeRouterConfig& c, float* scores) {
  const std::int64_t E = c.num_experts;
  if (c.score_function == RouterScoreFunction::kSoftmax) {
    softmax(logits, E, scores);
    return;
  }
  double sum = 0.0;
  for (std::int64_t e = 0; e < E; ++e) sum += scores[e] = sigmoid(logits[e]);
  for (std::int64_t e = 0; e < E; ++e) scores[e] = static_cast<float>(scores[e] / (sum + kSigmoidNormEps));
}
// `scores`: aux_scores() of these logits (the softmax's backward reads them).
void aux_scores_backward(const float* logits, const float* scores, const MoeRouterConfig& c, const float* g,
                         float* d_logits) {
  const std::int64_t E = c.num_experts;
  if (c.score_function == RouterScoreFunction::kSoftmax) {
    softmax_backward(scores, g, E, d_logits);
    return;
  }
  thread_local std::vector<float> s;
  s.resize(static_cast<std::size_t>(E));
  double sum = 0.0, dot = 0.0;
  for (std::int64_t e = 0; e < E; ++e) sum += s[e] = sigmoid(logits[e]);
  const double denominator = sum + kSigmoidNormEps;
  for (std::int64_t e = 0; e < E; ++e) dot += g[e] * (s[e] / denominator);
  for (std::int64_t e = 0; e < E; ++e)
    d_logits[e] += static_cast<float>((g[e] - dot) / denominator * s[e] * (1.0f - s[e]));
}

// Megatron's switch load-balancing loss per group of tokens (the micro-batch for aux_loss, each sequence
// for seq_aux_loss, averaged over the sequences): coeff * E / (k * n^2) * sum_e P_e * f_e over a group of n
// tokens, P_e the summed scores, f_e the tokens the scores' own top-k gives expert e. A shard of the tokens
// sums P_e over its own rows and takes f_e summed over all shards (`reduce`).
void load_balancing_loss(MoeRouting& r, const MoeRouterConfig& c, const TokenShard& shard,
                         const AuxLossCountsReduce& reduce) {
  const std::int64_t T = r.tokens, E = c.num_experts;
  const int k = c.topk;
  const std::int64_t global = shard.global_tokens > 0 ? shard.global_tokens : T;
  const std::int64_t group = c.load_balancing == LoadBalancingType::kSeqAuxLoss ? r.seq : global;
  const std::int64_t groups = global / group;
  auto group_of = [&](std::int64_t t) { return (shard.first_token + t) / group; };
  std::vector<float> scores(static_cast<std::size_t>(T * E));
  std::vector<std::int32_t> top(static_cast<std::size_t>(T * k));  // each token's top-k of its scores
  parallel_tokens(T, [&](std::int64_t first, std::int64_t end) {
    for (std::int64_t t = first; t < end; ++t) {
      aux_scores(&r.logits[t * E], c, &scores[t * E]);
      top_k(&scores[t * E], E, k, &top[t * k]);
    }
  });
  std::vector<double> counts(static_cast<std::size_t>(groups * E), 0.0);
  for (std::int64_t t = 0; t < T; ++t)
    for (int j = 0; j < k; ++j) counts[group_of(t) * E + top[t * k + j]] += 1.0;
  if (reduce) reduce(counts);
  const double scale =
      c.aux_loss_coeff * static_cast<double>(E) /
      (k * static_cast<double>(group) * static_cast<double>(group) * static_cast<double>(groups));
  for (std::int64_t t = 0; t < T; ++t) {  // in token order: the loss's sum does not depend on threads
    const double* f = &counts[group_of(t) * E];
    for (std::int64_t e = 0; e < E; ++e) r.aux_loss += scale * scores[t * E + e] * f[e];
  }
  // The gradient by score per group, g_e = scale * f_e, then each token's through its scores.
  std::vector<float> g(counts.size());
  for (std::size_t i = 0; i < counts.size(); ++i) g[i] = static_cast<float>(scale * counts[i]);
  r.aux_loss_grad.assign(static_cast<std::size_t>(T * E), 0.0f);
  parallel_tokens(T, [&](std::int64_t first, std::int64_t end) {
    for (std::int64_t t = first; t < end; ++t)
      aux_scores_backward(&r.logits[t * E], &scores[t * E], c, &g[group_of(t) * E], &r.aux_loss_grad[t * E]);
  });
}

}  // namespace

RouterScoreFunction parse_router_score_function(std::string_view text) {
  if (text == "softmax") return RouterScoreFunction::kSoftmax;
  if (text == "sigmoid") return RouterScoreFunction::kSigmoid;
  throw UserError("--moe-router-score-function: unknown value '" + std::string(text) +
                  "'; use softmax or sigmoid");
}

LoadBalancingType parse_load_balancing_type(std::string_view text) {
  if (text == "aux_loss") return LoadBalancingType::kAuxLoss;
  if (text == "seq_aux_loss") return LoadBalancingType::kSeqAuxLoss;
  if (text == "none") return LoadBalancingType::kNone;
  throw UserError("--moe-router-load-balancing-type: unknown value '" + std::string(text) +
                  "'; use aux_loss, seq_aux_loss or none");
}

std::int64_t MoeRouterConfig::expert_capacity(std::int64_t tokens) const {
  const auto capacity = static_cast<std::int64_t>(
      std::ceil(static_cast<double>(tokens * topk) / static_cast<double>(num_experts) * capacity_factor));
  return std::min(capacity, tokens);
}

void MoeRouterConfig::validate(std::int64_t experts) const {
  if (topk < 1 || topk > experts)
    throw UserError("--moe-router-topk must lie in [1, --num-experts] (got " + std::to_string(topk) +
                    " for " + std::to_string(experts) + " experts)");
  if (aux_loss_coeff < 0.0) throw UserError("--moe-aux-loss-coeff must be >= 0");
  if ((num_groups > 0) != (group_topk > 0))
    throw UserError("group-limited routing needs both --moe-router-num-groups and --moe-router-group-topk");
  if (num_groups > 0) {
    if (experts % num_groups != 0)
      throw UserError("--moe-router-num-groups " + std::to_string(num_groups) + " must divide --num-experts " +
                      std::to_string(experts));
    if (group_topk > num_groups || topk % group_topk != 0 || topk / group_topk > experts / num_groups)
      throw UserError("--moe-router-group-topk " + std::to_string(group_topk) +
                      " must be at most --moe-router-num-groups, divide --moe-router-topk " + std::to_string(topk) +
                      ", and leave each group at least topk / group-topk experts (DeepSeek-V3: 256 experts, "
                      "8 groups, group-topk 4, topk 8)");
  }
  if (!(z_loss_coeff >= 0.0)) throw UserError("--moe-z-loss-coeff must be >= 0 (ST-MoE: 1e-3)");
  if (!(topk_scaling_factor >= 0.0))
    throw UserError("--moe-router-topk-scaling-factor must be >= 0 (DeepSeek-V3: 2.5)");
  if (enable_expert_bias && score_function != RouterScoreFunction::kSigmoid)
    throw UserError("--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid");
  if (!(bias_update_rate >= 0.0)) throw UserError("--moe-router-bias-update-rate must be >= 0");
  if (pad_to_capacity && !drops_tokens())
    throw UserError("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor (the capacity)");
}

MoeRouting route_tokens(const float* logits, std::int64_t tokens, std::int64_t seq, const MoeRouterConfig& c,
                        const float* expert_bias, const TokenShard& shard,
                        const AuxLossCountsReduce& reduce) {
  MoeRouting r = route_tokens_choice(logits, tokens, seq, c, expert_bias);
  add_load_balancing_loss(r, c, shard, reduce);
  return r;
}

void add_load_balancing_loss(MoeRouting& r, const MoeRouterConfig& c, const TokenShard& shard,
                             const AuxLossCountsReduce& reduce) {
  if (c.has_aux_loss()) load_balancing_loss(r, c, shard, reduce);
  if (c.z_loss_coeff <= 0.0) return;
  const std::int64_t T = r.tokens, E = c.num_experts;
  const double count = static_cast<double>(shard.global_tokens > 0 ? shard.global_tokens : T);
  if (r.aux_loss_grad.empty()) r.aux_loss_grad.assign(static_cast<std::size_t>(T * E), 0.0f);
  double z = 0.0;
  std::vector<float> p(static_cast<std::size_t>(E));
  for (std::int64_t t = 0; t < T; ++t) {
    const float* row = &r.logits[t * E];
    const float top = *std::max_element(row, row + E);
    double sum = 0.0;
    for (std::int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(row[e] - top));
    const double lse = top + std::log(sum);
    z += lse * lse;
    softmax(row, E, p.data());
    // d(coeff * lse^2 / count) / d logits = coeff * 2 * lse * softmax / count
    const double scale = c.z_loss_coeff * 2.0 * lse / count;
    for (std::int64_t e = 0; e < E; ++e) r.aux_loss_grad[t * E + e] += static_cast<float>(scale * p[e]);
  }
  r.z_loss = c.z_loss_coeff * z / count;
}

MoeRouting route_tokens_choice(const float* logits, std::int64_t tokens, std::int64_t seq,
                               const MoeRouterConfig& c, const float* expert_bias) {
  const std::int64_t E = c.num_experts;
  const int k = c.topk;
  MoeRouting r;
  r.tokens = tokens;
  r.seq = seq;
  r.topk = k;
  r.logits.assign(logits, logits + tokens * E);
  r.expert.resize(static_cast<std::size_t>(tokens * k));
  r.prob.resize(static_cast<std::size_t>(tokens * k));
  r.kept.assign(static_cast<std::size_t>(tokens * k), 1);
  // Serial: the GPU waits for the choice, and one pass over 8192 tokens x 8 experts (~0.3 ms) is less than
  // starting the threads costs on a loaded host.
  for (std::int64_t t = 0; t < tokens; ++t)
    choose(logits + t * E, c, expert_bias, &r.expert[t * k], &r.prob[t * k]);
  if (c.topk_scaling_factor > 0.0)  // Megatron: probs * scaling_factor after the top-k, before the drop
    for (float& p : r.prob) p *= static_cast<float>(c.topk_scaling_factor);
  if (c.drops_tokens()) drop_over_capacity(r, c);
  r.tokens_per_expert.assign(static_cast<std::size_t>(E), 0);
  for (std::int64_t i = 0; i < tokens * k; ++i) r.tokens_per_expert[r.expert[i]] += r.kept[i];
  return r;
}

void route_tokens_backward(const MoeRouting& r, const MoeRouterConfig& c, const float* d_prob,
                           float aux_loss_scale, float* d_logits) {
  const std::int64_t E = c.num_experts, T = r.tokens;
  const int k = c.topk;
  std::fill(d_logits, d_logits + T * E, 0.0f);
  std::vector<float> dp(static_cast<std::size_t>(k)), p(static_cast<std::size_t>(k)),
      row(static_cast<std::size_t>(E)), dz_top(static_cast<std::size_t>(k)), ds(static_cast<std::size_t>(E));
  // The scaling factor's part: d(scaled)/d(unscaled) = factor; the formulas below take the unscaled ones.
  const float scale = c.topk_scaling_factor > 0.0 ? static_cast<float>(c.topk_scaling_factor) : 1.0f;
  for (std::int64_t t = 0; t < T; ++t) {
    const float* z = &r.logits[t * E];
    float* dz = d_logits + t * E;
    const std::int32_t* top = &r.expert[t * k];
    for (int j = 0; j < k; ++j) {  // a dropped choice's weight is 0 whatever its probability
      dp[j] = r.kept[t * k + j] ? d_prob[t * k + j] * scale : 0.0f;
      p[j] = r.prob[t * k + j] / scale;
    }
    if (c.score_function == RouterScoreFunction::kSoftmax && !c.pre_softmax) {
      std::fill(dz_top.begin(), dz_top.end(), 0.0f);
      softmax_backward(p.data(), dp.data(), k, dz_top.data());
      for (int j = 0; j < k; ++j) dz[top[j]] += dz_top[j];
    } else if (c.score_function == RouterScoreFunction::kSoftmax) {
      softmax(z, E, row.data());
      std::fill(ds.begin(), ds.end(), 0.0f);
      for (int j = 0; j < k; ++j) ds[top[j]] += dp[j];
      softmax_backward(row.data(), ds.data(), E, dz);
    } else {
      double sum = 0.0, dot = 0.0;
      for (int j = 0; j < k; ++j) sum += sigmoid(z[top[j]]);
      for (int j = 0; j < k; ++j) dot += static_cast<double>(dp[j]) * p[j];
      for (int j = 0; j < k; ++j) {
        const float s = sigmoid(z[top[j]]);
        const double d_score = k > 1 ? (dp[j] - dot) / (sum + kSigmoidNormEps) : dp[j];
        dz[top[j]] += static_cast<float>(d_score * s * (1.0f - s));
      }
    }
  }
  if (r.aux_loss_grad.empty()) return;
  for (std::int64_t i = 0; i < T * E; ++i) d_logits[i] += aux_loss_scale * r.aux_loss_grad[i];
}

void update_expert_bias(const std::vector<double>& tokens_per_expert, double rate, std::vector<float>& bias) {
  double mean = 0.0;
  for (double n : tokens_per_expert) mean += n;
  mean /= static_cast<double>(tokens_per_expert.size());
  for (std::size_t e = 0; e < bias.size(); ++e) {
    const double offset = mean - tokens_per_expert[e];
    bias[e] += static_cast<float>(offset > 0 ? rate : offset < 0 ? -rate : 0.0);
  }
}

}  // namespace megatune::executor
