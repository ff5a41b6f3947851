// GPTModel: the parameter table's views, initialization, and the main parameters and gradients as flat
// vectors.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>

#include "base/user_error.h"
#include "executor/model/gpt_model.h"

namespace megatune::executor {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

const ParameterEntry& GPTModel::head_entry() const {
  return layout_.find(config_.tied_embeddings ? "embedding.word_embeddings.weight" : "output_layer.weight");
}

Tensor GPTModel::view(Tensor buffer, const ParameterEntry& entry) const {
  if (grads_sharded_ && buffer.data == nullptr && buffer.dtype == DType::kFP32 && buffer.cols == grads_.cols)
    return placed_grad_view(entry);
  if (gathered_at_use_ && buffer.data == nullptr && buffer.dtype == model_params_.dtype &&
      buffer.cols == model_params_.cols)
    return placed_view(entry);
  const std::int64_t offset = entry.offset;
  if (buffer.data == model_params_.data && buffer.numel() == model_params_.numel() &&
      buffer.dtype == model_params_.dtype && offset >= model_params_.numel())
    buffer = main_params_;  // not in the compute-dtype copy: the fp32 main parameter
  Tensor v;
  v.dtype = buffer.dtype;
  v.data = buffer.data == nullptr
               ? nullptr
               : static_cast<char*>(buffer.data) + offset * backend_.storage_bytes(buffer.dtype);
  v.rows = entry.rows;
  v.cols = entry.cols;
  v.row_stride = entry.cols;
  return v;
}

Tensor GPTModel::placed_view(const ParameterEntry& entry) const {
  for (const PlacedRange& p : placed_) {
    if (entry.offset < p.begin || entry.offset + entry.numel() > p.end) continue;
    Tensor v = p.storage;
    if (v.data != nullptr)
      v.data = static_cast<char*>(v.data) + (entry.offset - p.begin) * backend_.storage_bytes(v.dtype);
    v.rows = entry.rows;
    v.cols = v.row_stride = entry.cols;
    return v;
  }
  if (!placed_views_required_) {
    Tensor v;
    v.dtype = model_params_.dtype;
    v.rows = entry.rows;
    v.cols = v.row_stride = entry.cols;
    return v;
  }
  throw std::logic_error("GPTModel: parameter " + entry.name +
                         " read while FSDP optim_grads_params has not gathered it");
}

Tensor GPTModel::placed_grad_view(const ParameterEntry& entry) const {
  for (const PlacedRange& p : placed_grads_) {
    if (entry.offset < p.begin || entry.offset + entry.numel() > p.end) continue;
    Tensor v = p.storage;
    if (v.data != nullptr) v.data = static_cast<char*>(v.data) + (entry.offset - p.begin) * 4;
    v.rows = entry.rows;
    v.cols = v.row_stride = entry.cols;
    return v;
  }
  if (placed_views_required_)
    throw std::logic_error("GPTModel: the gradient of " + entry.name +
                           " written while FSDP has not placed its bucket's slot");
  Tensor v;
  v.dtype = DType::kFP32;
  v.rows = entry.rows;
  v.cols = v.row_stride = entry.cols;
  return v;
}

void GPTModel::unbind_range(std::int64_t begin, std::int64_t end, bool fresh_gradients) {
  const ParameterEntry* head = stage_.has_loss ? &head_entry() : nullptr;
  for (const ParameterEntry& e : layout_.entries()) {
    if (e.offset < begin || e.offset >= end) continue;
    unbound_codes_.push_back(e.layer);
    if (&e == head) unbound_codes_.push_back(-2);  // the LM head's linear reads it
    if (!fresh_gradients) continue;
    // The slot is zero: the first weight-gradient GEMM of its entries writes it (beta = 0).
    if (e.layer >= 0) layer_grads_written_.at(local_index(e.layer)) = false;
    if (&e == head) head_grad_written_ = false;
  }
}

void GPTModel::place_gradients(std::int64_t begin, std::int64_t end, Tensor storage) {
  if (!grads_sharded_ || storage.rows != 1 || storage.cols != end - begin || storage.dtype != DType::kFP32)
    throw std::logic_error("GPTModel::place_gradients: [" + std::to_string(begin) + ", " +
                           std::to_string(end) +
                           ") does not fit its storage or the model keeps its gradients");
  unbind_range(begin, end, true);
  for (PlacedRange& p : placed_grads_)
    if (p.begin == begin) {
      p = {begin, end, storage};
      return;
    }
  placed_grads_.push_back({begin, end, storage});
}

void GPTModel::release_gradients(std::int64_t begin) {
  const auto it = std::find_if(placed_grads_.begin(), placed_grads_.end(),
                               [&](const PlacedRange& p) { return p.begin == begin; });
  if (it == placed_grads_.end())
    throw std::logic_error("GPTModel::release_gradients: nothing placed at " + std::to_string(begin));
  const std::int64_t end = it->end;
  placed_grads_.erase(it);
  unbind_range(begin, end, false);
}

void GPTModel::place_parameters(int layer_code, std::int64_t begin, std::int64_t end, Tensor storage) {
  if (!gathered_at_use_ || storage.rows != 1 || storage.cols != end - begin ||
      storage.dtype != compute_dtype_)
    throw std::logic_error("GPTModel::place_parameters: [" + std::to_string(begin) + ", " +
                           std::to_string(end) + ") does not fit its storage or the model keeps a copy");
  unbound_codes_.push_back(layer_code);
  for (PlacedRange& p : placed_)
    if (p.begin == begin) {
      p = {begin, end, storage};
      return;
    }
  placed_.push_back({begin, end, storage});
}

void GPTModel::release_parameters(int layer_code, std::int64_t begin) {
  const auto it =
      std::find_if(placed_.begin(), placed_.end(), [&](const PlacedRange& p) { return p.begin == begin; });
  if (it == placed_.end())
    throw std::logic_error("GPTModel::release_parameters: nothing placed at " + std::to_string(begin));
  placed_.erase(it);
  unbound_codes_.push_back(layer_code);
}

void GPTModel::index_layer_parameters() {
  // Once: each local layer's parameters by role, so that the passes never look a name up.
  std::map<std::string, const ParameterEntry*> by_name;
  for (const ParameterEntry& e : layout_.entries()) by_name[e.name] = &e;
  int moe_layers = 0;
  for (int i = 0; i < local_layer_count(); ++i) {
    const int l = global_layer(i);
    const std::string prefix =
        l >= 0 ? layer_parameter(l, "") : layouts::mtp_parameter(-3 - l, "transformer_layer.");
    auto find = [&](int, const char* suffix) -> const ParameterEntry* {
      const auto it = by_name.find(prefix + suffix);
      return it == by_name.end() ? nullptr : it->second;
    };
    LayerParameters p;
    p.norm1_w = find(l, "input_layernorm.weight");
    p.norm1_b = find(l, "input_layernorm.bias");
    p.qkv_w = find(l, "self_attention.linear_qkv.weight");
    p.qkv_b = find(l, "self_attention.linear_qkv.bias");
    p.proj_w = find(l, "self_attention.linear_proj.weight");
    p.proj_b = find(l, "self_attention.linear_proj.bias");
    p.norm2_w = find(l, "pre_mlp_layernorm.weight");
    p.norm2_b = find(l, "pre_mlp_layernorm.bias");
    p.fc1_w = find(l, "mlp.linear_fc1.weight");
    p.fc1_b = find(l, "mlp.linear_fc1.bias");
    p.fc2_w = find(l, "mlp.linear_fc2.weight");
    p.fc2_b = find(l, "mlp.linear_fc2.bias");
    p.k_norm_w = find(l, "self_attention.k_layernorm.weight");
    p.k_norm_b = find(l, "self_attention.k_layernorm.bias");
    p.q_down = find(l, "self_attention.linear_q_down_proj.weight");
    p.q_norm_w = find(l, "self_attention.q_layernorm.weight");
    p.q_norm_b = find(l, "self_attention.q_layernorm.bias");
    p.q_up = find(l, config_.q_lora_rank > 0 ? "self_attention.linear_q_up_proj.weight"
                                             : "self_attention.linear_q_proj.weight");
    p.kv_down = find(l, "self_attention.linear_kv_down_proj.weight");
    p.kv_norm_w = find(l, "self_attention.kv_layernorm.weight");
    p.kv_norm_b = find(l, "self_attention.kv_layernorm.bias");
    p.kv_up = find(l, "self_attention.linear_kv_up_proj.weight");
    if (config_.is_moe_layer(l)) {
      p.moe_local = moe_layers++;
      p.router = find(l, "mlp.router.weight");
      p.shared_fc1 = find(l, "mlp.shared_experts.linear_fc1.weight");
      p.shared_fc2 = find(l, "mlp.shared_experts.linear_fc2.weight");
      const std::int64_t local = shape_.local_experts(), first = config_.expert_parallel_rank * local;
      for (std::int64_t e = first; e < first + local; ++e) {
        const std::string prefix = "mlp.experts.local_experts." + std::to_string(e) + ".";
        p.expert_fc1.push_back(find(l, (prefix + "linear_fc1.weight").c_str()));
        p.expert_fc2.push_back(find(l, (prefix + "linear_fc2.weight").c_str()));
      }
    }
    layer_parameters_.push_back(p);
  }
}

std::vector<int> GPTModel::moe_layer_numbers() const {
  std::vector<int> out;
  for (int i = 0; i < local_layer_count(); ++i)
    if (layer_parameters_[i].moe_local >= 0) out.push_back(global_layer(i));
  return out;
}

GPTModel::LayerWeights GPTModel::layer_weights(Tensor buffer, int l) const {
  const LayerParameters& p = layer_parameters_.at(local_index(l));
  auto get = [&](const ParameterEntry* e) { return e == nullptr ? Tensor{} : view(buffer, *e); };
  LayerWeights w;
  w.norm1_w = get(p.norm1_w);
  w.norm1_b = get(p.norm1_b);
  w.norm2_w = get(p.norm2_w);
  w.norm2_b = get(p.norm2_b);
  w.mla = {get(p.q_norm_w), get(p.q_norm_b), get(p.kv_norm_w), get(p.kv_norm_b)};
  if (config_.qk_layernorm) {
    w.q_norm_w = get(p.q_norm_w);
    w.q_norm_b = get(p.q_norm_b);
    w.k_norm_w = get(p.k_norm_w);
    w.k_norm_b = get(p.k_norm_b);
  }
  return w;
}

std::vector<float> GPTModel::initial_parameters(std::uint64_t seed) const {
  const std::vector<ParameterEntry>& entries = layout_.entries();
  std::vector<float> host(layout_.total_elements(), 0.0f);
  const float scaled_std = config_.init_std / std::sqrt(2.0f * config_.num_layers);
  auto init_one = [&](std::size_t i) {
    const ParameterEntry& e = entries[i];
    float* out = host.data() + e.offset;
    if (e.init == ParameterInit::kOnes) {
      std::fill(out, out + e.numel(), 1.0f);
    } else if (e.init == ParameterInit::kNormal || e.init == ParameterInit::kScaledNormal) {
      // The whole tensor from a generator seeded by the parameter's name, then this rank's slice.
      const float std = e.init == ParameterInit::kNormal ? config_.init_std : scaled_std;
      std::uint64_t name_hash = 0xcbf29ce484222325ull;  // FNV-1a
      for (char c : e.name) name_hash = (name_hash ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
      std::mt19937_64 rng(splitmix64(seed * 0x100000001B3ull ^ name_hash));
      std::normal_distribution<float> normal(0.0f, std);
      std::vector<float> global(static_cast<std::size_t>(e.global_rows() * e.global_cols()));
      for (float& v : global) v = normal(rng);
      // A routed expert is split over the expert-tensor-parallel group, the rest over TP.
      const bool expert = e.expert >= 0;
      const std::vector<float> local =
          tensor_parallel_slice(e, global, expert ? config_.expert_tensor_parallel_rank : tp_rank_,
                                expert ? config_.expert_tensor_parallel_size : tp_size_);
      std::copy(local.begin(), local.end(), out);
    }
  };
  const unsigned workers = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < workers; ++w)
    threads.emplace_back([&, w] {
      for (std::size_t i = w; i < entries.size(); i += workers) init_one(i);
    });
  for (std::thread& t : threads) t.join();
  return host;
}

std::vector<float> GPTModel::main_parameters() const {
  if (!keeps_main_parameters())
    throw std::logic_error("GPTModel::main_parameters: the distributed optimizer holds them, sharded");
  std::vector<float> host(layout_.total_elements());
  backend_.download(main_params_, host.data());
  return host;
}

void GPTModel::set_main_parameters(const std::vector<float>& values) {
  if (static_cast<std::int64_t>(values.size()) != layout_.total_elements())
    throw std::invalid_argument("set_main_parameters: wrong element count");
  if (gathered_at_use_)
    throw std::logic_error("GPTModel::set_main_parameters: the data-parallel strategy holds the parameters");
  if (!keeps_main_parameters()) {  // the copy covers every parameter
    backend_.upload(model_params_, values.data());
    return;
  }
  backend_.upload(main_params_, values.data());
  if (model_params_.data != main_params_.data) {
    Tensor copied = main_params_;  // the copy holds the first model_copy_elements_
    copied.cols = model_copy_elements_;
    copied.row_stride = copied.cols;
    backend_.copy(copied, model_params_);
  }
}

std::vector<float> GPTModel::gradients() const {
  if (grads_sharded_)
    throw std::logic_error("GPTModel::gradients: FSDP holds them, this rank's shard of each bucket");
  std::vector<float> host(layout_.total_elements());
  backend_.download(grads_, host.data());
  return host;
}

void GPTModel::fp8_weights_changed() {
  for (Fp8LinearState& state : fp8_states_) state.weight_cast = false;
}

void GPTModel::zero_gradients() {
  for (const Tensor& t : zeroed_grads_) backend_.fill_zero(t);
  layer_grads_written_.assign(local_layer_count(), false);
  fp8_weights_changed();
  head_grad_written_ = false;
  if (mtp_) mtp_->eh_proj_written.assign(mtp_->eh_proj_written.size(), false);
  if (moe_) moe_->reset_logged_load_balancing_loss();
}

}  // namespace megatune::executor
