// MoeAllGatherDispatcher: gathers over tp-ep, the local experts' permutation, reduce-scatters back.
#include "executor/model/moe_allgather_dispatch.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace megatune::executor {

namespace {
constexpr layouts::OpRole kAllgatherDispatchRole = layouts::OpRole::kExpertDispatch;
constexpr float kNotRouted = -1.0f;  // a routing entry no kept choice selected
}  // namespace

MoeAllGatherDispatcher::MoeAllGatherDispatcher(Backend& backend, Communicator& communicator,
                                               std::int64_t experts, std::int64_t local_tokens,
                                               std::int64_t hidden, DType dtype)
    : backend_(backend), communicator_(communicator), experts_(experts), local_tokens_(local_tokens) {
  size_ = communicator_.size(CommGroup::kTensorExpert);
  const int ep = communicator_.size(CommGroup::kExpert);
  ep_rank_ = communicator_.rank(CommGroup::kExpert);
  if (experts_ % ep != 0)
    throw std::invalid_argument("MoeAllGatherDispatcher: " + std::to_string(ep) +
                                " expert-parallel ranks for " + std::to_string(experts_) + " experts");
  local_experts_ = experts_ / ep;
  const char* label = "MoE all-gather buffers";
  routing_ = backend_.allocate(DType::kFP32, local_tokens_, experts_, label);
  all_routing_ = backend_.allocate(DType::kFP32, gathered_tokens(), experts_, label);
  gathered_ = backend_.allocate(dtype, gathered_tokens(), hidden, label);
  combined_ = backend_.allocate(dtype, gathered_tokens(), hidden, label);
  d_gathered_ = backend_.allocate(dtype, gathered_tokens(), hidden, label);
}

std::int64_t MoeAllGatherDispatcher::max_expert_rows(int topk) const {
  return gathered_tokens() * std::min<std::int64_t>(topk, local_experts_);
}

MoePermutation MoeAllGatherDispatcher::dispatch(const MoeRouting& routing, Tensor x,
                                                std::vector<std::int64_t>& expert_offset, int layer,
                                                layouts::OpPhase phase) {
  std::vector<float> mine(static_cast<std::size_t>(local_tokens_ * experts_), kNotRouted);
  for (std::int64_t t = 0; t < local_tokens_; ++t)
    for (int j = 0; j < routing.topk; ++j)
      if (routing.kept[t * routing.topk + j])
        mine[t * experts_ + routing.expert[t * routing.topk + j]] = routing.prob[t * routing.topk + j];
  backend_.upload(routing_, mine.data());
  communicator_.all_gather(CommGroup::kTensorExpert, routing_, all_routing_,
                           {"dispatch_probs_ag", layer, phase, kAllgatherDispatchRole});
  communicator_.all_gather(CommGroup::kTensorExpert, x, gathered_,
                           {"dispatch_ag", layer, phase, kAllgatherDispatchRole});
  std::vector<float> all(static_cast<std::size_t>(all_routing_.numel()));
  backend_.download(all_routing_, all.data());
  const std::int64_t G = gathered_tokens(), L = local_experts_, first = ep_rank_ * L;
  MoePermutation p;
  p.tokens = G;
  p.topk = static_cast<int>(L);
  p.token_rows.assign(static_cast<std::size_t>(G * L), -1);
  p.token_probs.assign(static_cast<std::size_t>(G * L), 0.0f);
  expert_offset.assign(static_cast<std::size_t>(L + 1), 0);
  for (std::int64_t e = 0; e < L; ++e) {
    expert_offset[e] = p.rows();
    for (std::int64_t t = 0; t < G; ++t) {
      const float prob = all[t * experts_ + first + e];
      if (prob < 0.0f) continue;
      p.token_rows[t * L + e] = static_cast<std::int32_t>(p.rows());
      p.token_probs[t * L + e] = prob;
      p.row_token.push_back(static_cast<std::int32_t>(t));
    }
  }
  expert_offset[L] = p.rows();
  return p;
}

void MoeAllGatherDispatcher::combine(Tensor y, int layer, layouts::OpPhase phase) {
  communicator_.reduce_scatter(CommGroup::kTensorExpert, combined_, y,
                               {"combine_rs", layer, phase, kAllgatherDispatchRole});
}

Tensor MoeAllGatherDispatcher::gather_output_grad(Tensor d_y, int layer) {
  communicator_.all_gather(CommGroup::kTensorExpert, d_y, d_gathered_,
                           {"combine_grad_ag", layer, layouts::OpPhase::kBackward, kAllgatherDispatchRole});
  return d_gathered_;
}

void MoeAllGatherDispatcher::scatter_input_grad(Tensor d_x, const MoePermutation& plan,
                                                const std::vector<float>& plan_d_probs,
                                                const MoeRouting& routing, std::vector<float>& d_probs,
                                                int layer) {
  const OpTag rs = {"dispatch_grad_rs", layer, layouts::OpPhase::kBackward, kAllgatherDispatchRole};
  communicator_.reduce_scatter(CommGroup::kTensorExpert, d_gathered_, d_x, rs);
  // The probabilities' gradient in the routing's (gathered tokens, E) layout, this rank's experts' columns.
  const std::int64_t G = gathered_tokens(), L = local_experts_, first = ep_rank_ * L;
  std::vector<float> all(static_cast<std::size_t>(G * experts_), 0.0f);
  for (std::int64_t t = 0; t < G; ++t)
    for (std::int64_t e = 0; e < L; ++e)
      if (plan.token_rows[t * L + e] >= 0) all[t * experts_ + first + e] = plan_d_probs[t * L + e];
  backend_.upload(all_routing_, all.data());
  communicator_.reduce_scatter(CommGroup::kTensorExpert, all_routing_, routing_,
                               {"dispatch_probs_grad_rs", layer, layouts::OpPhase::kBackward, kAllgatherDispatchRole});
  std::vector<float> mine(static_cast<std::size_t>(routing_.numel()));
  backend_.download(routing_, mine.data());
  d_probs.assign(static_cast<std::size_t>(local_tokens_ * routing.topk), 0.0f);
  for (std::int64_t t = 0; t < local_tokens_; ++t)
    for (int j = 0; j < routing.topk; ++j)
      d_probs[t * routing.topk + j] = mine[t * experts_ + routing.expert[t * routing.topk + j]];
}

}  // namespace megatune::executor
