// GPTModel's linear layers (executor/parallel/tensor_parallel.h): each layer's, the LM head's and the MTP
// layers' eh_proj, built once from the parameter table's entries (whose TP split makes each one column-,
// row-parallel or replicated), with their op labels, and pointed again at their weights where FSDP
// optim_grads_params placed them; and the per-layer views the attention and MoE blocks take.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "executor/model/gpt_model.h"
#include "layouts/parameter_table.h"

namespace megatune::executor {
namespace {

template <typename Linear>
const Linear* pointer(const std::optional<Linear>& linear) {
  return linear ? &*linear : nullptr;
}

// The one query projection (no --q-lora-rank) takes the qkv projection's place, and its collectives' labels.
const LinearLabels kQueryProjection{.gemm = "q_up",
                                    .input_gather = "qkv_input_ag",
                                    .reduce_all_reduce = "qkv_dgrad_ar",
                                    .reduce_scatter = "qkv_dgrad_rs"};
// The shared expert's collectives are named for the block.
const LinearLabels kSharedFc1{.gemm = "shared_fc1",
                              .input_gather = "shared_input_ag",
                              .reduce_all_reduce = "shared_dgrad_ar",
                              .reduce_scatter = "shared_dgrad_rs"};
const LinearLabels kSharedFc2{.gemm = "shared_fc2", .grad_gather = "shared_grad_ag"};
// An MTP layer's use of the shared LM head: its GEMMs are the MTP layer's, its collectives the head's.
const LinearLabels kMtpHead{.gemm = "mtp_logits",
                            .input_gather = "logits_input_ag",
                            .reduce_all_reduce = "logits_dgrad_ar",
                            .reduce_scatter = "logits_dgrad_rs"};

}  // namespace

LinearParameters GPTModel::linear_parameters(const ParameterEntry& weight, const ParameterEntry* bias) const {
  LinearParameters p;
  p.weight = view(model_params_, weight);
  p.d_weight = view(grads_, weight);
  if (bias != nullptr) {
    p.bias = view(model_params_, *bias);
    p.d_bias = view(grads_, *bias);
  }
  return p;
}

GPTModel::LayerLinears GPTModel::layer_linears(const LayerParameters& p, int l) const {
  auto linear = [&](const ParameterEntry* weight, const ParameterEntry* bias,
                    const LinearLabels& labels) -> std::optional<TensorParallelLinear> {
    if (weight == nullptr) return std::nullopt;
    return TensorParallelLinear(*weight, linear_parameters(*weight, bias), labels, l, tp_);
  };
  auto experts = [&](const std::vector<const ParameterEntry*>& weights, const char* label) {
    std::vector<LinearParameters> params;
    for (const ParameterEntry* e : weights) params.push_back(linear_parameters(*e, nullptr));
    return ExpertLinears(std::move(params), label, l, backend_);
  };
  LayerLinears lin;
  lin.qkv = linear(p.qkv_w, p.qkv_b, {"qkv"});
  lin.proj = linear(p.proj_w, p.proj_b, {"proj"});
  lin.fc1 = linear(p.fc1_w, p.fc1_b, {"fc1"});
  lin.fc2 = linear(p.fc2_w, p.fc2_b, {"fc2"});
  lin.q_down = linear(p.q_down, nullptr, {"q_down"});
  lin.q_up = linear(p.q_up, nullptr, config_.q_lora_rank > 0 ? LinearLabels{"q_up"} : kQueryProjection);
  lin.kv_down = linear(p.kv_down, nullptr, {"kv_down"});
  lin.kv_up = linear(p.kv_up, nullptr, {"kv_up"});
  lin.router = linear(p.router, nullptr, {"router"});
  lin.shared_fc1 = linear(p.shared_fc1, nullptr, kSharedFc1);
  lin.shared_fc2 = linear(p.shared_fc2, nullptr, kSharedFc2);
  if (p.moe_local >= 0) {
    lin.expert_fc1 = experts(p.expert_fc1, "expert_fc1");
    lin.expert_fc2 = experts(p.expert_fc2, "expert_fc2");
  }
  return lin;
}

void GPTModel::build_linears() {
  for (int i = 0; i < local_layer_count(); ++i)
    layer_linears_.push_back(layer_linears(layer_parameters_[i], global_layer(i)));
  if (!stage_.has_loss) return;
  const ParameterEntry& head = head_entry();
  head_.emplace(head, linear_parameters(head, nullptr), LinearLabels{"logits"}, -1, tp_);
  for (int d = 0; d < stage_.num_mtp_layers; ++d) {
    const int k = stage_.first_mtp_layer + d;
    mtp_heads_.emplace_back(head, linear_parameters(head, nullptr), kMtpHead, -3 - k, tp_);
    const ParameterEntry& eh_proj = layout_.find(layouts::mtp_parameter(k, "eh_proj.weight"));
    eh_proj_.emplace_back(eh_proj, linear_parameters(eh_proj, nullptr), LinearLabels{"mtp_eh_proj"}, -3 - k,
                          tp_);
  }
}

void GPTModel::bind_placed_linears() {
  if (unbound_codes_.empty()) return;
  std::sort(unbound_codes_.begin(), unbound_codes_.end());
  unbound_codes_.erase(std::unique(unbound_codes_.begin(), unbound_codes_.end()), unbound_codes_.end());
  placed_views_required_ = false;  // a linear of an entry not placed holds a view without storage
  const auto bind = [](auto& held, const auto& fresh) {
    if (held && fresh) held->set_parameters(fresh->parameters());
  };
  for (const int code : unbound_codes_) {
    if (code == -2 && head_) head_->set_parameters(linear_parameters(head_entry(), nullptr));
    if (code < 0) continue;  // the embedding has no linear
    const int i = local_index(code);
    const LayerLinears fresh = layer_linears(layer_parameters_.at(i), code);
    LayerLinears& held = layer_linears_.at(i);
    bind(held.qkv, fresh.qkv);
    bind(held.proj, fresh.proj);
    bind(held.fc1, fresh.fc1);
    bind(held.fc2, fresh.fc2);
    bind(held.q_down, fresh.q_down);
    bind(held.q_up, fresh.q_up);
    bind(held.kv_down, fresh.kv_down);
    bind(held.kv_up, fresh.kv_up);
    bind(held.router, fresh.router);
    bind(held.shared_fc1, fresh.shared_fc1);
    bind(held.shared_fc2, fresh.shared_fc2);
    bind(held.expert_fc1, fresh.expert_fc1);
    bind(held.expert_fc2, fresh.expert_fc2);
  }
  unbound_codes_.clear();
  placed_views_required_ = true;
}

MoeLayerLinears GPTModel::moe_linears(int l) const {
  const LayerLinears& lin = layer_linears_.at(local_index(l));
  MoeLayerLinears w;
  w.router = pointer(lin.router);
  w.fc1 = pointer(lin.expert_fc1);
  w.fc2 = pointer(lin.expert_fc2);
  w.shared_fc1 = pointer(lin.shared_fc1);
  w.shared_fc2 = pointer(lin.shared_fc2);
  return w;
}

MlaAttention::Weights GPTModel::mla_weights(int l) const {
  const LayerLinears& lin = layer_linears_.at(local_index(l));
  MlaAttention::Weights w;
  w.q_down = pointer(lin.q_down);
  w.q_up = pointer(lin.q_up);
  w.kv_down = pointer(lin.kv_down);
  w.kv_up = pointer(lin.kv_up);
  w.norms = layer_weights(model_params_, l).mla;
  w.norm_grads = layer_weights(grads_, l).mla;
  return w;
}

}  // namespace megatune::executor
