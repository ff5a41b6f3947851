// MoE routing on the host, as Megatron's TopKRouter does it: router logits -> score function (softmax
// after or before the top-k; sigmoid with an optional expert bias that steers only the choice) -> top-k
// experts and their probabilities -> token drop by expert capacity; the load-balancing losses (aux_loss,
// seq_aux_loss) and the backward of all of it to the logits.
#pragma once
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace megatune::executor {

enum class RouterScoreFunction { kSoftmax, kSigmoid };
enum class LoadBalancingType { kAuxLoss, kSeqAuxLoss, kNone };

// Parses Megatron's flag values; UserError naming the flag for anything else.
RouterScoreFunction parse_router_score_function(std::string_view text);  // softmax | sigmoid
LoadBalancingType parse_load_balancing_type(std::string_view text);      // aux_loss | seq_aux_loss | none

struct MoeRouterConfig {
  std::int64_t num_experts = 0;                                        // --num-experts
  int topk = 2;                                                        // --moe-router-topk
  RouterScoreFunction score_function = RouterScoreFunction::kSoftmax;  // --moe-router-score-function
  bool pre_softmax = false;  // --moe-router-pre-softmax (softmax only: sigmoid ignores it, as Megatron)
  LoadBalancingType load_balancing = LoadBalancingType::kAuxLoss;      // --moe-router-load-balancing-type
  double aux_loss_coeff = 0.0;                                         // --moe-aux-loss-coeff
  double capacity_factor = 0.0;  // --moe-expert-capacity-factor; <= 0: dropless
  // --moe-pad-expert-input-to-capacity: every expert gets exactly its capacity of rows from each rank
  // (the kept tokens, then copies that carry no weight and no gradient), as Megatron pads them.
  bool pad_to_capacity = false;
  bool enable_expert_bias = false;  // --moe-router-enable-expert-bias (sigmoid routing only)
  double bias_update_rate = 1e-3;   // --moe-router-bias-update-rate
  // --moe-router-num-groups / --moe-router-group-topk: the top-k from the group_topk best of num_groups
  // expert groups (0: over all experts).
  int num_groups = 0, group_topk = 0;
  double z_loss_coeff = 0.0;  // --moe-z-loss-coeff: coeff * mean(logsumexp(logits)^2) added to the loss
  double topk_scaling_factor = 0.0;  // --moe-router-topk-scaling-factor: the chosen probabilities times it (0: 1)
  bool drops_tokens() const { return capacity_factor > 0.0; }
  // Megatron's get_capacity(tokens * topk, experts, factor): the rows each expert keeps of `tokens` routed
  // tokens, ceil(tokens * topk / experts * factor), at most every token once. Needs drops_tokens().
  std::int64_t expert_capacity(std::int64_t tokens) const;
  bool has_aux_loss() const { return load_balancing != LoadBalancingType::kNone && aux_loss_coeff > 0.0; }
  // Throws UserError naming the flag.
  void validate(std::int64_t experts) const;
};

// One micro-batch's routing: T tokens, each with its top-k experts in descending score order.
struct MoeRouting {
  std::int64_t tokens = 0, seq = 0;
  int topk = 0;
  std::vector<float> logits;                    // (T, E) the router's logits (the backward reads them)
  std::vector<std::int32_t> expert;             // (T, k) chosen expert
  std::vector<float> prob;                      // (T, k) its routing probability before the drop
  std::vector<std::uint8_t> kept;               // (T, k) 0 where the expert's capacity dropped the token
  std::vector<std::int64_t> tokens_per_expert;  // (E) tokens each expert processes (after the drop)
  // Load-balancing loss of the micro-batch with the coefficient applied (0 without one), and its
  // gradient with respect to the logits (T, E), before the loss scaling.
  double aux_loss = 0.0;
  std::vector<float> aux_loss_grad;  // with the z-loss's gradient added (--moe-z-loss-coeff)
  double z_loss = 0.0;               // this shard's part of the micro-batch's z-loss, coefficient applied
};

// The probability a token's k-th choice is weighted with: prob, or 0 where it was dropped.
inline float routed_prob(const MoeRouting& r, std::int64_t i) { return r.kept[i] ? r.prob[i] : 0.0f; }

// Where a rank's T routed rows sit in the micro-batch's tokens: rows [first_token, first_token + T) of
// global_tokens (sequence parallelism: the TP rank's shard; 0: the rank holds them all).
struct TokenShard {
  std::int64_t first_token = 0, global_tokens = 0;
};
// Sums the load-balancing loss's token counts (groups, E) over the ranks sharing the micro-batch's tokens
// (Megatron's reduction over the tensor(-context)-parallel group); empty: this rank holds them all.
using AuxLossCountsReduce = std::function<void(std::vector<double>& counts)>;

// Routes T = tokens rows of logits (T, E) in sequences of `seq` tokens (rows b * seq + s of the micro-batch,
// of which this rank holds `shard`); expert_bias (E, may be null) is added to the sigmoid scores for the
// choice only. The load-balancing loss of a shard is Megatron's: the expert counts of its groups (the
// micro-batch, or each sequence) summed over the shards by `reduce`, the scores its own rows', so that the
// shards' losses (and gradients) add up to the whole micro-batch's.
MoeRouting route_tokens(const float* logits, std::int64_t tokens, std::int64_t seq,
                        const MoeRouterConfig& config, const float* expert_bias, const TokenShard& shard = {},
                        const AuxLossCountsReduce& reduce = {});
// The same choice without the load-balancing loss (aux_loss 0, no aux_loss_grad): what the permutation
// needs. add_load_balancing_loss() completes it later (a GPU step computes the loss on the host while the
// experts run, not while the GPU waits for the permutation).
MoeRouting route_tokens_choice(const float* logits, std::int64_t tokens, std::int64_t seq,
                               const MoeRouterConfig& config, const float* expert_bias);
// Also adds the router z-loss (ST-MoE's, Megatron's z_loss_func) when the config has one: each token's
// logsumexp squared, over the micro-batch's tokens (a shard's sum over the whole micro-batch's count, so the
// shards add up to it, as Megatron's coefficient / TP-size over each rank's own tokens does).
void add_load_balancing_loss(MoeRouting& routing, const MoeRouterConfig& config, const TokenShard& shard = {},
                             const AuxLossCountsReduce& reduce = {});

// d_logits (T, E) = d(probabilities)/d(logits)^T d_prob + aux_loss_scale * the aux loss gradient, from the
// gradient of the loss with respect to each chosen probability, d_prob (T, k).
void route_tokens_backward(const MoeRouting& routing, const MoeRouterConfig& config, const float* d_prob,
                           float aux_loss_scale, float* d_logits);

// DeepSeek-V3's aux-loss-free balancing (Megatron's get_updated_expert_bias): each expert's bias moves by
// `rate` towards the mean load: + rate when it got fewer tokens than the mean, - rate when more.
void update_expert_bias(const std::vector<double>& tokens_per_expert, double rate, std::vector<float>& bias);

}  // namespace megatune::executor
