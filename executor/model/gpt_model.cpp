// GPTModel: buffers, initialization, and the forward/backward passes of the decoder LM over a Backend.
#include "executor/model/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>

#include "executor/model/linear_gemm.h"
#include "executor/parallel/context_parallel_split.h"
#include "layouts/step_program.h"
#include "layouts/user_error.h"

namespace megatune::executor {
namespace {

// A norm recomputed in the backward from the statistics its forward stored (NormArgs::stats_given).
NormArgs with_stats(NormArgs a) {
  a.stats_given = true;
  return a;
}

using layouts::OpPhase;
constexpr OpPhase kF = OpPhase::kForward;
constexpr OpPhase kB = OpPhase::kBackward;
constexpr layouts::OpRole kTpRole = layouts::OpRole::kTensorParallel;

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

GPTModel::GPTModel(const TransformerConfig& config, const BatchShape& batch, RecomputeGranularity recompute,
                   DType compute_dtype, Backend& backend, Communicator& communicator, const StageSpan& stage)
    : config_(config),
      batch_(batch),
      recompute_(recompute),
      compute_dtype_(compute_dtype),
      backend_(backend),
      communicator_(communicator),
      stage_(with_mtp_layers(config, stage)),
      layout_(config, stage_) {
  config_.validate();
  if (stage_.num_layers < 0) stage_.num_layers = config_.num_layers - stage_.first_layer;
  if (stage_.first_layer < 0 || stage_.first_layer + stage_.num_layers > config_.num_layers)
    throw std::invalid_argument("GPTModel: stage layers outside the model");
  tp_rank_ = communicator_.rank(CommGroup::kTensor);
  tp_size_ = communicator_.size(CommGroup::kTensor);
  cp_rank_ = communicator_.rank(CommGroup::kContext);
  cp_size_ = communicator_.size(CommGroup::kContext);
  if (tp_size_ != config_.tensor_parallel_size)
    throw std::invalid_argument("GPTModel: the communicator's tensor-parallel group has " +
                                std::to_string(tp_size_) + " ranks, the model config " +
                                std::to_string(config_.tensor_parallel_size));
  if (batch_.seq > config_.max_seq && config_.position == PositionEmbedding::kLearned)
    throw UserError("--seq-length " + std::to_string(batch_.seq) + " exceeds --max-position-embeddings " +
                    std::to_string(config_.max_seq));
  // Context parallelism: this rank holds its two chunks of every sequence (batch_.seq is from here on the
  // local sequence) at their global positions.
  if (batch_.seq % (2 * cp_size_) != 0 && cp_size_ > 1)
    throw std::invalid_argument("GPTModel: the sequence does not split into 2 x cp chunks");
  positions_ = context_parallel_positions(batch_.seq, cp_size_, cp_rank_);
  batch_.seq /= cp_size_;
  const std::int64_t T = batch_.tokens(), h = config_.hidden, total = layout_.total_elements();
  if (sp() && T % tp_size_ != 0)
    throw UserError("--sequence-parallel: micro-batch tokens (" + std::to_string(T) +
                    ") must divide by --tensor-model-parallel-size " + std::to_string(tp_size_));
  rows_ = sp() ? T / tp_size_ : T;
  if (config_.mla && cp_size_ > 1)
    throw UserError("--multi-latent-attention with --context-parallel-size " + std::to_string(cp_size_) +
                    ": the executor runs multi-latent attention without context parallelism; use "
                    "--context-parallel-size 1");
  if (config_.mla)
    mla_ = std::make_unique<MlaAttention>(config_, batch_.micro_batch, batch_.seq, rows_, compute_dtype_,
                                          backend_, communicator_);
  require_attention_support();
  if (cp_size_ > 1 && stage_.num_layers > 0)
    ring_ = std::make_unique<RingAttention>(ring_shape(), compute_dtype_, backend_, communicator_);
  index_layer_parameters();
  if (batch_.activation_slots < 1) throw std::invalid_argument("GPTModel: activation_slots must be >= 1");
  main_params_ = backend_.allocate(DType::kFP32, 1, total, "fp32 main parameters");
  // The compute-dtype copy covers every parameter a GEMM or norm reads. An untied word embedding (and the
  // learned positions) is only gathered: the lookup reads the fp32 main parameters and no copy is kept. The
  // buffer order is Megatron's (reversed): the embedding tables are the last elements, so the copy is the
  // buffer's first model_copy_elements_.
  model_copy_elements_ = total;
  if (compute_dtype_ != DType::kFP32 && !config_.tied_embeddings && stage_.has_embedding &&
      !batch_.compute_copy_of_every_parameter) {
    const bool learned = config_.position == PositionEmbedding::kLearned;
    model_copy_elements_ = layout_.entries()[learned ? 1 : 0].offset;
  }
  model_params_ = compute_dtype_ == DType::kFP32 ? main_params_
                                                 : backend_.allocate(compute_dtype_, 1, model_copy_elements_,
                                                                     "model parameters (compute dtype)");
  grads_ = backend_.allocate(DType::kFP32, 1, total, "fp32 main gradients");
  // The buffer ranges zero_gradients() clears: everything but the GEMM weights (the LM head's included; a
  // tied head is the word embedding, which the head's gradient GEMM writes before the embedding's backward
  // adds to it).
  std::vector<std::pair<std::int64_t, std::int64_t>> gemm_weights;  // [begin, end) in elements
  const ParameterEntry* head = stage_.has_loss ? &head_entry() : nullptr;
  for (const ParameterEntry& e : layout_.entries()) {
    if (e.gemm_weight || &e == head) gemm_weights.emplace_back(e.offset, e.offset + e.numel());
  }
  std::sort(gemm_weights.begin(), gemm_weights.end());
  std::int64_t next = 0;
  gemm_weights.emplace_back(total, total);
  for (const auto& [begin, end] : gemm_weights) {
    if (begin > next) zeroed_grads_.push_back(carve(grads_, next, 1, begin - next, 4));
    next = std::max(next, end);
  }
  layer_grads_written_.assign(local_layer_count(), false);
  if (grads_.data != nullptr && total > 0) backend_.fill_zero(grads_);  // once: the GEMM weights' ranges too

  const int L = local_layer_count();
  const bool mtp_final_norm = config_.mtp_num_layers > 0 && holds_last_layer();
  slots_.resize(batch_.activation_slots);
  for (Slot& slot : slots_)
    for (int l = 0; l <= stage_.num_layers + (mtp_final_norm ? 1 : 0); ++l)
      slot.residual.push_back(backend_.allocate(compute_dtype_, rows_, h, "residual stream (layer inputs)"));
  // Buffers shared by every layer. mlp_scratch_ holds, in turn: the activation output (forward), in backward
  // fc2's data gradient and then the recomputed activation output, then the attention output gradient and
  // the qkv gradient side by side.
  const std::int64_t ffn = config_.ffn_per_rank(), attn_w = config_.attention_width(),
                     qkv_w = config_.qkv_width(), storage = backend_.storage_bytes(compute_dtype_);
  norm1_out_ = backend_.allocate(compute_dtype_, T, h, "norm outputs (shared, recomputed)");
  norm2_out_ = backend_.allocate(compute_dtype_, T, h, "norm outputs (shared, recomputed)");
  if (sp()) {
    norm1_shard_ = backend_.allocate(compute_dtype_, rows_, h, "norm outputs (shared, recomputed)");
    norm2_shard_ = backend_.allocate(compute_dtype_, rows_, h, "norm outputs (shared, recomputed)");
  } else {
    norm1_shard_ = norm1_out_;
    norm2_shard_ = norm2_out_;
  }
  mlp_scratch_ = backend_.allocate(compute_dtype_, 1, T * std::max(ffn, attn_w + qkv_w),
                                   "activation output / gradient scratch (shared)");
  const bool keep_attention = recompute_ == RecomputeGranularity::kNone;
  if (recompute_ == RecomputeGranularity::kFull) {
    if (L > 0) full_recompute_set_ = allocate_layer_activations(keep_attention);
  } else {
    for (Slot& slot : slots_)
      for (int l = 0; l < L; ++l) slot.saved.push_back(allocate_layer_activations(keep_attention));
  }
  if (!keep_attention && L > 0) {
    shared_attn_ = backend_.allocate(compute_dtype_, T, attn_w, "recomputed attention (shared)");
    shared_lse_ = backend_.allocate(DType::kFP32, batch_.micro_batch * config_.heads_per_rank(), batch_.seq,
                                    "recomputed attention (shared)");
    const Tensor shared_kv =
        cp_size_ > 1
            ? backend_.allocate(compute_dtype_, T, 2 * config_.kv_heads_per_rank() * config_.head_dim,
                                "recomputed attention (shared)")
            : Tensor{};
    auto share = [&](LayerActivations& acts) {
      acts.attn = shared_attn_;
      acts.lse = shared_lse_;
      acts.cp_kv = shared_kv;
    };
    share(full_recompute_set_);
    for (Slot& slot : slots_)
      for (LayerActivations& acts : slot.saved) share(acts);
  }
  if (holds_final_norm())
    for (Slot& slot : slots_) {
      if (!mtp_final_norm) slot.final_norm = backend_.allocate(compute_dtype_, rows_, h, "final norm");
      slot.final_mean = backend_.allocate(DType::kFP32, rows_, 1, "final norm");
      slot.final_rstd = backend_.allocate(DType::kFP32, rows_, 1, "final norm");
    }
  if (stage_.has_loss) {
    loss_chunk_rows_ = layouts::loss_chunk_rows(T, config_.vocab_per_rank(), batch_.loss_chunk_logits_bytes);
    logits_ = backend_.allocate(compute_dtype_, loss_chunk_rows_, config_.vocab_per_rank(),
                                "logits (and their gradient), one token chunk");
    if (tp_size_ > 1) {
      ce_stats_.row_max = backend_.allocate(DType::kFP32, loss_chunk_rows_, 1,
                                            "logits (and their gradient), one token chunk");
      ce_stats_.target_logit = backend_.allocate(DType::kFP32, loss_chunk_rows_, 1,
                                                 "logits (and their gradient), one token chunk");
      ce_stats_.sum_exp = backend_.allocate(DType::kFP32, loss_chunk_rows_, 1,
                                            "logits (and their gradient), one token chunk");
    }
  }
  for (Slot& slot : slots_) slot.tokens = backend_.allocate_int32(T, 1, "tokens, targets, losses");
  targets_ = backend_.allocate_int32(T, 1, "tokens, targets, losses");
  losses_ = backend_.allocate(DType::kFP32, batch_.num_microbatches, T, "tokens, targets, losses");
  d_res_ = backend_.allocate(compute_dtype_, rows_, h, "backward scratch (T, h)");
  d_mid_ = backend_.allocate(compute_dtype_, rows_, h, "backward scratch (T, h)");
  d_hidden_ = backend_.allocate(compute_dtype_, T, h, "backward scratch (T, h)");
  fc2_out_ = d_hidden_;  // forward only; d_hidden_ is dead between layers' backwards
  if (sp()) {
    reduced_ = backend_.allocate(compute_dtype_, rows_, h, "backward scratch (T, h)");
    d_hidden_shard_ = reduced_;  // forward and backward use it at different times
    full_scratch_ = backend_.allocate(compute_dtype_, T, h, "gathered activations (sequence parallel)");
  } else {
    reduced_ = fc2_out_;
    d_hidden_shard_ = d_hidden_;
  }
  // The LM head's gradient of the final norm output: the backward scratch for the one slot of an unpipelined
  // run (its backward follows at once), a buffer per slot otherwise.
  // With MTP the main head's gradient waits for the MTP layers' backward: a buffer of its own.
  if (stage_.has_loss)
    for (std::size_t i = 0; i < slots_.size(); ++i)
      slots_[i].head_grad = i == 0 && stage_.num_mtp_layers == 0
                                ? d_hidden_
                                : backend_.allocate(compute_dtype_, T, h, "pipeline gradients (per slot)");
  for (Slot& slot : slots_) {
    if (!stage_.has_loss)
      slot.output_grad = backend_.allocate(compute_dtype_, rows_, h, "pipeline gradients (per slot)");
    if (!stage_.has_embedding)
      slot.input_grad = backend_.allocate(compute_dtype_, rows_, h, "pipeline gradients (per slot)");
  }
  d_attn_ = carve(mlp_scratch_, 0, T, attn_w, storage);
  d_qkv_ = carve(mlp_scratch_, T * attn_w, T, qkv_w, storage);
  int moe_count = 0;
  for (const LayerParameters& p : layer_parameters_) moe_count += p.moe_local >= 0 ? 1 : 0;
  if (moe_count > 0)
    moe_ = std::make_unique<MoeLayers>(config_, T, batch_.seq, moe_count, batch_.activation_slots,
                                       compute_dtype_, backend_, communicator_);
  if (stage_.num_mtp_layers > 0) allocate_mtp();
  counted_tokens_.assign(batch_.num_microbatches, 0.0);
  slot_of_microbatch_.assign(batch_.num_microbatches, -1);
  forward_done_.assign(batch_.num_microbatches, false);

  Backend::ScratchNeeds needs;
  needs.tokens = T;
  needs.hidden = h;
  needs.max_bias_cols = std::max({h, config_.qkv_width(), config_.fc1_width()});
  needs.vocab = config_.vocab_per_rank();
  needs.attention = attention_args(L > 0 ? activations_for(0, 0) : LayerActivations{});
  const std::int64_t scratch_bytes = backend_.scratch_bytes(needs);
  if (scratch_bytes > 0)
    backend_.set_scratch(backend_.allocate(DType::kFP32, 1, (scratch_bytes + 3) / 4, "kernel scratch"));
}

GPTModel::LayerActivations GPTModel::allocate_layer_activations(bool with_attention) {
  const std::int64_t T = batch_.tokens(), h = config_.hidden;
  LayerActivations a;
  a.ln1 = norm1_out_;
  a.ln1_mean = backend_.allocate(DType::kFP32, rows_, 1, "saved: norm statistics");
  a.ln1_rstd = backend_.allocate(DType::kFP32, rows_, 1, "saved: norm statistics");
  if (mla_)
    a.mla = mla_->allocate_saved();
  else
    a.qkv = backend_.allocate(compute_dtype_, T, config_.qkv_width(), "saved: qkv");
  if (with_attention) {
    a.attn = backend_.allocate(compute_dtype_, T, config_.attention_width(), "saved: attention output");
    a.lse = backend_.allocate(DType::kFP32, batch_.micro_batch * config_.heads_per_rank(), batch_.seq,
                              "saved: attention output");
    if (cp_size_ > 1)
      a.cp_kv = backend_.allocate(compute_dtype_, T, 2 * config_.kv_heads_per_rank() * config_.head_dim,
                                  "saved: context-parallel K,V block");
  }
  a.mid = backend_.allocate(compute_dtype_, rows_, h, "saved: mid residual");
  a.ln2 = norm2_out_;
  a.ln2_mean = backend_.allocate(DType::kFP32, rows_, 1, "saved: norm statistics");
  a.ln2_rstd = backend_.allocate(DType::kFP32, rows_, 1, "saved: norm statistics");
  a.fc1 = backend_.allocate(compute_dtype_, T, config_.fc1_width(), "saved: fc1 output (pre-activation)");
  a.act = carve(mlp_scratch_, 0, T, config_.ffn_per_rank(), backend_.storage_bytes(compute_dtype_));
  return a;
}

const ParameterEntry& GPTModel::head_entry() const {
  return layout_.find(config_.tied_embeddings ? "embedding.word_embeddings.weight" : "output_layer.weight");
}

Tensor GPTModel::view(Tensor buffer, const ParameterEntry& entry) const {
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

void GPTModel::index_layer_parameters() {
  // Once: each local layer's parameters by role, so that the passes never look a name up.
  std::map<std::string, const ParameterEntry*> by_name;
  for (const ParameterEntry& e : layout_.entries()) by_name[e.name] = &e;
  int moe_layers = 0;
  for (int i = 0; i < local_layer_count(); ++i) {
    const int l = i < stage_.num_layers ? stage_.first_layer + i
                                        : -3 - (stage_.first_mtp_layer + i - stage_.num_layers);
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
      const std::int64_t local = config_.local_experts(), first = config_.expert_parallel_rank * local;
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
    if (layer_parameters_[i].moe_local >= 0)
      out.push_back(i < stage_.num_layers ? stage_.first_layer + i
                                          : -3 - (stage_.first_mtp_layer + i - stage_.num_layers));
  return out;
}

MoeLayerWeights GPTModel::moe_weights(Tensor buffer, int l) const {
  const LayerParameters& p = layer_parameters_.at(local_index(l));
  auto get = [&](const ParameterEntry* e) { return e == nullptr ? Tensor{} : view(buffer, *e); };
  MoeLayerWeights w;
  w.router = get(p.router);
  for (const ParameterEntry* e : p.expert_fc1) w.fc1.push_back(get(e));
  for (const ParameterEntry* e : p.expert_fc2) w.fc2.push_back(get(e));
  w.shared_fc1 = get(p.shared_fc1);
  w.shared_fc2 = get(p.shared_fc2);
  return w;
}

void GPTModel::moe_mlp_backward(int l, LayerActivations& a, Tensor d_out, Tensor d_in, bool accumulate) {
  // On the sequence shard (moe_layer.h): the routed experts' backward, then the recompute of the block's
  // input (the pre-MLP norm output, unless a full-recompute re-run of the layer has just written it) that
  // the shared expert's and the router's weight gradients read.
  const MoeLayerWeights w = moe_weights(model_params_, l), g = moe_weights(grads_, l);
  const int local = layer_parameters_.at(local_index(l)).moe_local;
  moe_->backward_routed(w, g, d_out, d_in, moe_slot_, local, l, accumulate);
  const LayerWeights n = layer_weights(model_params_, l);
  if (recompute_ != RecomputeGranularity::kFull)
    backend_.norm_forward(
        with_stats(norm_args(a.mid, {}, {}, n.norm2_w, n.norm2_b, norm2_shard_, a.ln2_mean, a.ln2_rstd)),
        {"pre_mlp_norm", l, OpPhase::kRecompute});
  const float aux_loss_scale =
      static_cast<float>(1.0 / (batch_.num_microbatches * batch_.gradient_average_ranks));
  moe_->backward_dense(w, g, norm2_shard_, a.ln2, d_out, d_in, moe_slot_, local, l, accumulate,
                       aux_loss_scale);
}

GPTModel::LayerWeights GPTModel::layer_weights(Tensor buffer, int l) const {
  const LayerParameters& p = layer_parameters_.at(local_index(l));
  auto get = [&](const ParameterEntry* e) { return e == nullptr ? Tensor{} : view(buffer, *e); };
  LayerWeights w;
  w.norm1_w = get(p.norm1_w);
  w.norm1_b = get(p.norm1_b);
  w.qkv_w = get(p.qkv_w);
  w.qkv_b = get(p.qkv_b);
  w.proj_w = get(p.proj_w);
  w.proj_b = get(p.proj_b);
  w.norm2_w = get(p.norm2_w);
  w.norm2_b = get(p.norm2_b);
  w.fc1_w = get(p.fc1_w);
  w.fc1_b = get(p.fc1_b);
  w.fc2_w = get(p.fc2_w);
  w.fc2_b = get(p.fc2_b);
  w.mla = {get(p.q_down),  get(p.q_norm_w),  get(p.q_norm_b),  get(p.q_up),
           get(p.kv_down), get(p.kv_norm_w), get(p.kv_norm_b), get(p.kv_up)};
  return w;
}

void GPTModel::initialize_parameters(std::uint64_t seed) {
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
  set_main_parameters(host);
}

std::vector<float> GPTModel::main_parameters() const {
  std::vector<float> host(layout_.total_elements());
  backend_.download(main_params_, host.data());
  return host;
}

void GPTModel::set_main_parameters(const std::vector<float>& values) {
  if (static_cast<std::int64_t>(values.size()) != layout_.total_elements())
    throw std::invalid_argument("set_main_parameters: wrong element count");
  backend_.upload(main_params_, values.data());
  if (model_params_.data != main_params_.data) {
    Tensor copied = main_params_;  // the copy holds the first model_copy_elements_
    copied.cols = model_copy_elements_;
    copied.row_stride = copied.cols;
    backend_.copy(copied, model_params_);
  }
}

std::vector<float> GPTModel::gradients() const {
  std::vector<float> host(layout_.total_elements());
  backend_.download(grads_, host.data());
  return host;
}

void GPTModel::zero_gradients() {
  for (const Tensor& t : zeroed_grads_) backend_.fill_zero(t);
  layer_grads_written_.assign(local_layer_count(), false);
  head_grad_written_ = false;
  if (mtp_) mtp_->eh_proj_written.assign(mtp_->eh_proj_written.size(), false);
  if (moe_) moe_->reset_logged_load_balancing_loss();
}

Tensor GPTModel::reduce_from_full(Tensor full, Tensor shard_out, const char* ar_label, const char* rs_label,
                                  int layer, OpPhase phase) {
  if (tp_size_ == 1) return full;
  if (sp()) {
    communicator_.reduce_scatter(CommGroup::kTensor, full, shard_out, {rs_label, layer, phase, kTpRole});
    return shard_out;
  }
  communicator_.all_reduce(CommGroup::kTensor, full, ReduceOp::kSum, {ar_label, layer, phase, kTpRole});
  return full;
}

Tensor GPTModel::gather_to_full(Tensor shard, Tensor full_out, const char* label, int layer, OpPhase phase) {
  if (!sp()) return shard;
  communicator_.all_gather(CommGroup::kTensor, shard, full_out, {label, layer, phase, kTpRole});
  return full_out;
}

std::vector<const ParameterEntry*> GPTModel::sequence_parallel_grad_entries() const {
  std::vector<const ParameterEntry*> out;
  for (const ParameterEntry& e : layout_.entries())
    if (e.sequence_parallel_grad) out.push_back(&e);
  return out;
}

int GPTModel::slot_of(int index) {
  if (index < 0 || index >= batch_.num_microbatches)
    throw std::out_of_range("micro-batch index out of range");
  if (slot_of_microbatch_[index] >= 0) return slot_of_microbatch_[index];
  std::vector<bool> used(slots_.size(), false);
  for (int s : slot_of_microbatch_)
    if (s >= 0) used[s] = true;
  for (std::size_t s = 0; s < slots_.size(); ++s)
    if (!used[s]) return slot_of_microbatch_[index] = static_cast<int>(s);
  throw std::logic_error("more micro-batches in flight than activation slots (" +
                         std::to_string(slots_.size()) + ")");
}

void GPTModel::release(int index) {
  if (forward_done_.at(index)) throw std::logic_error("release of a micro-batch before its backward");
  slot_of_microbatch_.at(index) = -1;
}

Tensor GPTModel::stage_input(int index) { return slots_[slot_of(index)].residual.front(); }
Tensor GPTModel::stage_output(int index) { return slots_[slot_of(index)].residual.back(); }
Tensor GPTModel::output_grad(int index) {
  if (stage_.has_loss) throw std::logic_error("output_grad on the loss stage");
  return slots_[slot_of(index)].output_grad;
}
Tensor GPTModel::input_grad(int index) {
  if (stage_.has_embedding) throw std::logic_error("input_grad on the embedding stage");
  return slots_[slot_of(index)].input_grad;
}

NormArgs GPTModel::norm_args(Tensor x, Tensor residual, Tensor sum_out, Tensor gamma, Tensor beta, Tensor out,
                             Tensor mean, Tensor rstd) const {
  NormArgs a;
  a.kind = config_.norm;
  a.eps = config_.norm_eps;
  a.x = x;
  a.residual = residual;
  a.sum_out = sum_out;
  a.gamma = gamma;
  a.beta = config_.norm == NormKind::kLayerNorm ? beta : Tensor{};
  a.out = out;
  a.mean = config_.norm == NormKind::kLayerNorm ? mean : Tensor{};
  a.rstd = rstd;
  return a;
}

AttentionArgs GPTModel::attention_args(const LayerActivations& acts) const {
  if (mla_) return mla_->attention_args(acts.mla, acts.attn, acts.lse);
  return self_attention_args(acts.qkv, acts.attn, acts.lse, batch_.micro_batch, batch_.seq,
                             config_.heads_per_rank(), config_.kv_heads_per_rank(), config_.head_dim,
                             backend_.storage_bytes(compute_dtype_));
}

void GPTModel::require_attention_support() const {
  if (local_layer_count() == 0) return;
  std::string gap = backend_.attention_unsupported(attention_shape(attention_args(LayerActivations{})));
  for (const layouts::RingBlock block :
       {layouts::RingBlock::kFirstHalfKeys, layouts::RingBlock::kSecondHalfQueries})
    if (gap.empty() && cp_size_ > 1) {
      gap = backend_.attention_unsupported(ring_kernel_shape(ring_shape(), block));
      if (!gap.empty()) gap = "context parallelism's ring: " + gap;
    }
  if (!gap.empty() && config_.mla)
    throw UserError("the " + backend_.name() +
                    " backend cannot run this model's multi-latent attention (q/k " + "head dim " +
                    std::to_string(config_.head_dim) + " = --qk-head-dim + --qk-pos-emb-head-dim, " +
                    "--v-head-dim " + std::to_string(config_.v_head_dim) + "): " + gap +
                    "; pick those dims accordingly, or --device cpu");
  if (!gap.empty())
    throw UserError(
        "the " + backend_.name() + " backend cannot run this model's attention (--kv-channels " +
        std::to_string(config_.head_dim) + "): " + gap +
        "; pick --kv-channels (or --hidden-size / --num-attention-heads) accordingly, or --device cpu");
}

RingAttentionShape GPTModel::ring_shape() const {
  RingAttentionShape ring;
  ring.batch = batch_.micro_batch;
  ring.local_seq = batch_.seq;
  ring.heads = config_.heads_per_rank();
  ring.kv_heads = config_.kv_heads_per_rank();
  ring.head_dim = config_.head_dim;
  ring.softmax_scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
  return ring;
}

void GPTModel::core_attention_forward(LayerActivations& a, int layer, OpPhase phase) {
  if (ring_) {
    ring_->forward(a.qkv, a.attn, a.lse, a.cp_kv, layer, phase);
    return;
  }
  backend_.attention_forward(attention_args(a), {"attn", layer, phase});
}

void GPTModel::core_attention_backward(LayerActivations& a, int layer) {
  if (ring_) {
    ring_->backward(a.qkv, a.attn, a.lse, a.cp_kv, d_attn_, d_qkv_, layer);
    return;
  }
  const AttentionArgs attention = attention_args(a);
  backend_.attention_backward(
      attention, packed_attention_grads(d_attn_, d_qkv_, attention, backend_.storage_bytes(compute_dtype_)),
      {"attn", layer, kB});
}

GPTModel::LayerActivations& GPTModel::activations_for(int slot, int local_layer) {
  return recompute_ == RecomputeGranularity::kFull ? full_recompute_set_ : slots_[slot].saved[local_layer];
}

void GPTModel::layer_forward(int l, LayerActivations& a, Tensor input, Tensor output, OpPhase phase) {
  const LayerWeights w = layer_weights(model_params_, l);
  const std::int64_t T = batch_.tokens();
  // Row-parallel biases are added once: on TP rank 0, before the reduction.
  const bool row_bias = tp_rank_ == 0;
  auto gemm_linear = [&](Tensor x, Tensor weight, Tensor bias, Tensor y, const char* label) {
    backend_.gemm(linear_forward_args(x, weight, y, bias, T), {label, l, phase});
  };
  backend_.norm_forward(norm_args(input, {}, {}, w.norm1_w, w.norm1_b, norm1_shard_, a.ln1_mean, a.ln1_rstd),
                        {"input_norm", l, phase});
  if (mla_) {
    // Only the one query projection (no --q-lora-rank) reads the gathered input.
    const Tensor x_full = config_.q_lora_rank > 0
                              ? norm1_shard_
                              : gather_to_full(norm1_shard_, a.ln1, "qkv_input_ag", l, phase);
    mla_->forward(l, w.mla, norm1_shard_, x_full, a.mla, phase);
  } else {
    gather_to_full(norm1_shard_, a.ln1, "qkv_input_ag", l, phase);
    gemm_linear(a.ln1, w.qkv_w, w.qkv_b, a.qkv, "qkv");
    if (config_.position == PositionEmbedding::kRope)
      backend_.rope(a.qkv, batch_.seq, config_.heads_per_rank(), config_.kv_heads_per_rank(),
                    config_.head_dim, config_.rope_theta, false, {"rope", l, phase}, positions_);
  }
  core_attention_forward(a, l, phase);
  gemm_linear(a.attn, w.proj_w, row_bias ? w.proj_b : Tensor{}, fc2_out_, "proj");
  const Tensor proj = reduce_from_full(fc2_out_, reduced_, "proj_ar", "proj_rs", l, phase);
  // The residual add fused into the pre-MLP norm: a.mid = bf16(proj output + input), a.ln2 = norm(a.mid).
  backend_.norm_forward(
      norm_args(proj, input, a.mid, w.norm2_w, w.norm2_b, norm2_shard_, a.ln2_mean, a.ln2_rstd),
      {"pre_mlp_norm", l, phase});
  const int moe_local = layer_parameters_.at(local_index(l)).moe_local;
  if (moe_local >= 0) {  // on the sequence shard (moe_layer.h)
    moe_->forward(moe_weights(model_params_, l), norm2_shard_, a.ln2, reduced_, moe_slot_, moe_local, l,
                  phase);
    backend_.add(a.mid, reduced_, output, {"residual2", l, phase});
    return;
  }
  gather_to_full(norm2_shard_, a.ln2, "fc1_input_ag", l, phase);
  if (config_.activation == ActivationKind::kGelu) {
    // fc1 with bias and GELU fused in the GEMM's epilogue; a.fc1 keeps the pre-activation for the backward.
    backend_.linear_gelu_forward(linear_forward_args(a.ln2, w.fc1_w, a.fc1, w.fc1_b, T), a.act,
                                 {"fc1", l, phase});
  } else {
    gemm_linear(a.ln2, w.fc1_w, w.fc1_b, a.fc1, "fc1");
    backend_.activation_forward(config_.activation, a.fc1, a.act, {"act", l, phase});
  }
  gemm_linear(a.act, w.fc2_w, row_bias ? w.fc2_b : Tensor{}, fc2_out_, "fc2");
  const Tensor fc2 = reduce_from_full(fc2_out_, reduced_, "fc2_ar", "fc2_rs", l, phase);
  backend_.add(a.mid, fc2, output, {"residual2", l, phase});
}

void GPTModel::layer_backward(int l, LayerActivations& a, Tensor input) {
  const LayerWeights w = layer_weights(model_params_, l);
  const LayerWeights g = layer_weights(grads_, l);
  const int local = local_index(l);
  const std::int64_t T = batch_.tokens();
  // The shared norm outputs hold another layer's values unless a full-recompute forward re-run of this layer
  // has just written them.
  const bool recompute_shared = recompute_ != RecomputeGranularity::kFull;
  const OpPhase kR = OpPhase::kRecompute;
  auto dgrad = [&](Tensor dy, Tensor weight, Tensor dx, const char* label) {
    backend_.gemm(linear_data_grad_args(dy, weight, dx, T), {label, l, kB});
  };
  // dW (+)= dy^T . x into the fp32 grad buffer (overwriting on the iteration's first write), the bias
  // gradient (column sums of dy) fused in.
  const bool accumulate = layer_grads_written_[local];
  layer_grads_written_[local] = true;
  auto wgrad = [&](Tensor dy, Tensor x, Tensor weight, Tensor d_weight, Tensor d_bias, const char* label) {
    GemmArgs args = linear_weight_grad_args(dy, x, weight, d_weight, d_bias, T);
    args.accumulate = accumulate;
    backend_.gemm(args, {label, l, kB});
  };
  // MLP. d_res_ holds the gradient of the layer output (its sequence shard under SP, gathered for the GEMMs).
  // fc2's data gradient goes to the shared activation buffer; one pass then turns it into fc1's output
  // gradient (in place over the saved fc1 output, which nothing reads afterwards) and recomputes the
  // activation output (in place over the data gradient) for fc2's weight gradient.
  Tensor d_ln2 = d_hidden_shard_;
  if (layer_is_moe(l)) {
    moe_mlp_backward(l, a, d_res_, d_ln2, accumulate);
  } else {
    const Tensor d_out = gather_to_full(d_res_, full_scratch_, "fc2_grad_ag", l, kB);
    dgrad(d_out, w.fc2_w, a.act, "fc2_dgrad");
    backend_.activation_backward_recompute(config_.activation, a.fc1, a.act, a.fc1, a.act, {"act", l, kB});
    wgrad(d_out, a.act, w.fc2_w, g.fc2_w, g.fc2_b, "fc2_wgrad");
    const Tensor d_fc1 = a.fc1;
    if (recompute_shared)
      backend_.norm_forward(
          with_stats(norm_args(a.mid, {}, {}, w.norm2_w, w.norm2_b, norm2_shard_, a.ln2_mean, a.ln2_rstd)),
          {"pre_mlp_norm", l, kR});
    gather_to_full(norm2_shard_, a.ln2, "fc1_input_ag", l, kB);
    dgrad(d_fc1, w.fc1_w, d_hidden_, "fc1_dgrad");
    wgrad(d_fc1, a.ln2, w.fc1_w, g.fc1_w, g.fc1_b, "fc1_wgrad");
    d_ln2 = reduce_from_full(d_hidden_, d_hidden_shard_, "fc1_dgrad_ar", "fc1_dgrad_rs", l, kB);
  }

  backend_.norm_backward(norm_args(a.mid, {}, {}, w.norm2_w, w.norm2_b, norm2_shard_, a.ln2_mean, a.ln2_rstd),
                         d_ln2, d_res_, d_mid_, g.norm2_w, g.norm2_b, {"pre_mlp_norm", l, kB});
  // Attention.
  if (recompute_ == RecomputeGranularity::kSelective) core_attention_forward(a, l, kR);
  const Tensor d_proj = gather_to_full(d_mid_, full_scratch_, "proj_grad_ag", l, kB);
  dgrad(d_proj, w.proj_w, d_attn_, "proj_dgrad");
  wgrad(d_proj, a.attn, w.proj_w, g.proj_w, g.proj_b, "proj_wgrad");
  if (mla_) {
    mla_backward(l, a, input, accumulate);
  } else {
    core_attention_backward(a, l);
    if (config_.position == PositionEmbedding::kRope)
      backend_.rope(d_qkv_, batch_.seq, config_.heads_per_rank(), config_.kv_heads_per_rank(),
                    config_.head_dim, config_.rope_theta, true, {"rope", l, kB}, positions_);
    if (recompute_shared)
      backend_.norm_forward(
          with_stats(norm_args(input, {}, {}, w.norm1_w, w.norm1_b, norm1_shard_, a.ln1_mean, a.ln1_rstd)),
          {"input_norm", l, kR});
    gather_to_full(norm1_shard_, a.ln1, "qkv_input_ag", l, kB);
    dgrad(d_qkv_, w.qkv_w, d_hidden_, "qkv_dgrad");
    wgrad(d_qkv_, a.ln1, w.qkv_w, g.qkv_w, g.qkv_b, "qkv_wgrad");
    reduce_from_full(d_hidden_, d_hidden_shard_, "qkv_dgrad_ar", "qkv_dgrad_rs", l, kB);
  }
  const Tensor d_ln1 = d_hidden_shard_;  // the input norm output's gradient
  backend_.norm_backward(norm_args(input, {}, {}, w.norm1_w, w.norm1_b, norm1_shard_, a.ln1_mean, a.ln1_rstd),
                         d_ln1, d_mid_, d_res_, g.norm1_w, g.norm1_b, {"input_norm", l, kB});
}

void GPTModel::mla_backward(int l, LayerActivations& a, Tensor input, bool accumulate) {
  const LayerWeights w = layer_weights(model_params_, l);
  const LayerWeights g = layer_weights(grads_, l);
  if (recompute_ != RecomputeGranularity::kFull)
    backend_.norm_forward(
        with_stats(norm_args(input, {}, {}, w.norm1_w, w.norm1_b, norm1_shard_, a.ln1_mean, a.ln1_rstd)),
        {"input_norm", l, OpPhase::kRecompute});
  const Tensor x_full =
      config_.q_lora_rank > 0 ? norm1_shard_ : gather_to_full(norm1_shard_, a.ln1, "qkv_input_ag", l, kB);
  mla_->backward(l, w.mla, g.mla, a.mla, a.attn, a.lse, d_attn_, norm1_shard_, x_full, d_hidden_shard_,
                 sp() ? d_hidden_ : d_hidden_shard_, accumulate);
}

void GPTModel::forward(const MicroBatch& mb, int index) { run_forward(mb, index, true); }

void GPTModel::embedding_forward(const MicroBatch& mb, int slot) {
  embed_tokens(mb.tokens, slots_[slot].tokens, slots_[slot].residual.front(), positions_, -1);
}

void GPTModel::embed_tokens(const std::vector<std::int32_t>& global_ids, Tensor tokens, Tensor output,
                            const SequencePositions& positions, int layer) {
  // Vocab-parallel: this rank's slice of the vocabulary holds ids [offset, offset + V / tp); other ids look
  // up a zero row (-1) and the all-reduce (or reduce-scatter under SP) over TP sums the slices. Learned
  // positions are added once, on TP rank 0.
  const std::int64_t T = batch_.tokens(), vocab = config_.vocab_per_rank(), offset = tp_rank_ * vocab;
  std::vector<std::int32_t> local(static_cast<std::size_t>(T));
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t id = global_ids[t] - offset;
    local[t] = tp_size_ == 1 || (id >= 0 && id < vocab) ? static_cast<std::int32_t>(id) : -1;
  }
  backend_.upload_int32(tokens, local.data());
  Tensor position;
  if (config_.position == PositionEmbedding::kLearned && tp_rank_ == 0)
    position = view(model_params_, layout_.find("embedding.position_embeddings.weight"));
  const Tensor full = sp() ? full_scratch_ : output;
  backend_.embedding_forward(tokens, view(model_params_, layout_.find("embedding.word_embeddings.weight")),
                             position, batch_.seq, full, {"embedding", layer, kF}, positions);
  reduce_from_full(full, output, "embedding_ar", "embedding_rs", layer, kF);
}

void GPTModel::run_forward(const MicroBatch& mb, int index, bool with_gradients) {
  const std::int64_t T = batch_.tokens();
  if (index < 0 || index >= batch_.num_microbatches)
    throw std::out_of_range("micro-batch index out of range");
  if (forward_done_[index]) throw std::logic_error("forward of a micro-batch whose backward has not run");
  const bool needs_tokens = stage_.has_embedding, needs_labels = stage_.has_loss;
  if ((needs_tokens && static_cast<std::int64_t>(mb.tokens.size()) != T) ||
      (needs_labels && (static_cast<std::int64_t>(mb.labels.size()) != T ||
                        static_cast<std::int64_t>(mb.loss_mask.size()) != T)))
    throw std::invalid_argument("micro-batch size does not match micro_batch * seq");
  const int slot = slot_of(index);
  moe_slot_ = slot;
  if (stage_.has_embedding) embedding_forward(mb, slot);
  Slot& s = slots_[slot];
  for (int i = 0; i < stage_.num_layers; ++i)
    layer_forward(stage_.first_layer + i, activations_for(slot, i), s.residual[i], s.residual[i + 1], kF);
  if (config_.mtp_num_layers > 0 && holds_last_layer()) final_norm_forward(slot, kF);
  if (stage_.num_mtp_layers > 0) mtp_forward(mb, index, slot, with_gradients);
  if (stage_.has_loss) loss_forward(mb, index, slot, with_gradients);
  if (with_gradients)
    forward_done_[index] = true;
  else if (stage_.has_loss)
    slot_of_microbatch_[index] = -1;  // nothing to send: the slot is free
}

void GPTModel::forward_only(const MicroBatch& mb, int index) { run_forward(mb, index, false); }

void GPTModel::loss_forward(const MicroBatch& mb, int index, int slot, bool with_gradients) {
  const std::int64_t T = batch_.tokens();
  Slot& s = slots_[slot];
  std::vector<std::int32_t> targets(T);
  double counted = 0.0;
  for (std::int64_t t = 0; t < T; ++t) {
    const bool counts = mb.loss_mask[t] != 0.0f;
    targets[t] = counts ? mb.labels[t] : -1;
    counted += counts ? 1.0 : 0.0;
  }
  counted_tokens_[index] = counted;
  backend_.upload_int32(targets_, targets.data());
  // Mean over the counted tokens of the micro-batch, averaged over the iteration's micro-batches.
  const float grad_scale =
      counted > 0
          ? static_cast<float>(1.0 / (counted * batch_.num_microbatches * batch_.gradient_average_ranks))
          : 0.0f;
  // With MTP the last decoder layer's stage applied the final norm (its output ends the residual stream).
  Tensor hidden = s.residual.back();
  if (config_.mtp_num_layers == 0) {
    const auto [fn_w, fn_b] = norm_weights(model_params_, "decoder.final_layernorm");
    backend_.norm_forward(
        norm_args(s.residual.back(), {}, {}, fn_w, fn_b, s.final_norm, s.final_mean, s.final_rstd),
        {"final_norm", -1, kF});
    hidden = s.final_norm;
  }
  head_and_loss(hidden, targets_, rows_of(losses_, index, 1, 4), grad_scale, s.head_grad, with_gradients,
                {"logits", "logits_dgrad", "logits_wgrad"}, -1);
}

void GPTModel::head_and_loss(Tensor hidden, Tensor targets, Tensor losses_row, float grad_scale,
                             Tensor head_grad, bool with_gradients, const HeadLabels& labels, int layer) {
  const std::int64_t T = batch_.tokens();
  const Tensor final_full = gather_to_full(hidden, full_scratch_, "logits_input_ag", layer, kF);
  // LM head and loss per token chunk (layouts::loss_chunk_rows): logits, cross entropy (losses, and the
  // logits' gradient in place; vocab-parallel under TP), then the head's data gradient (into head_grad,
  // read by the backward's final norm) and weight gradient, so one chunk of logits is held at a time.
  const ParameterEntry& out_entry = head_entry();
  const Tensor out_w = view(model_params_, out_entry);
  const std::int64_t storage = backend_.storage_bytes(compute_dtype_);
  const std::int64_t vocab_offset = tp_rank_ * config_.vocab_per_rank();
  for (std::int64_t first = 0; first < T; first += loss_chunk_rows_) {
    const std::int64_t rows = std::min(loss_chunk_rows_, T - first);
    const Tensor logits = carve(logits_, 0, rows, logits_.cols, storage);
    const Tensor chunk_hidden = rows_of(final_full, first, rows, storage);
    backend_.gemm(linear_forward_args(chunk_hidden, out_w, logits, {}, rows), {labels.logits, layer, kF});
    Tensor losses = losses_row;
    losses.data = losses.data == nullptr ? nullptr : static_cast<float*>(losses.data) + first;
    losses.cols = rows;
    const Tensor chunk_targets = rows_of(targets, first, rows, 4);
    if (tp_size_ == 1) {
      backend_.cross_entropy(logits, chunk_targets, losses, grad_scale, {"cross_entropy", layer, kF});
    } else {
      Backend::CrossEntropyStats stats;
      stats.row_max = carve(ce_stats_.row_max, 0, rows, 1, 4);
      stats.target_logit = carve(ce_stats_.target_logit, 0, rows, 1, 4);
      stats.sum_exp = carve(ce_stats_.sum_exp, 0, rows, 1, 4);
      auto reduce = [&](Tensor t, bool is_max, const char* label) {
        communicator_.all_reduce(CommGroup::kTensor, t, is_max ? ReduceOp::kMax : ReduceOp::kSum,
                                 {label, layer, kF, kTpRole});
      };
      backend_.vocab_parallel_cross_entropy(logits, chunk_targets, vocab_offset, losses, grad_scale, stats,
                                            reduce, {"cross_entropy", layer, kF});
    }
    if (!with_gradients) continue;
    backend_.gemm(linear_data_grad_args(logits, out_w, rows_of(head_grad, first, rows, storage), rows),
                  {labels.dgrad, layer, kB});
    GemmArgs head_wgrad =
        linear_weight_grad_args(logits, chunk_hidden, out_w, view(grads_, out_entry), {}, rows);
    head_wgrad.accumulate = head_grad_written_;
    head_grad_written_ = true;
    backend_.gemm(head_wgrad, {labels.wgrad, layer, kB});
  }
}

void GPTModel::loss_backward(int slot) {
  // The slot's head_grad holds the gradient of the final norm's output (the LM head's data gradient, from
  // forward()), partial over the vocabulary slices under TP.
  Slot& s = slots_[slot];
  if (config_.mtp_num_layers > 0) {  // the final norm's backward follows the MTP layers'
    reduce_from_full(s.head_grad, mtp_->main_head_grad, "logits_dgrad_ar", "logits_dgrad_rs", -1, kB);
    return;
  }
  const Tensor d_final =
      reduce_from_full(s.head_grad, d_hidden_shard_, "logits_dgrad_ar", "logits_dgrad_rs", -1, kB);
  Tensor fn_b, d_fn_b;
  if (config_.norm == NormKind::kLayerNorm) {
    fn_b = view(model_params_, layout_.find("decoder.final_layernorm.bias"));
    d_fn_b = view(grads_, layout_.find("decoder.final_layernorm.bias"));
  }
  const ParameterEntry& fn_w = layout_.find("decoder.final_layernorm.weight");
  backend_.norm_backward(norm_args(s.residual.back(), {}, {}, view(model_params_, fn_w), fn_b, s.final_norm,
                                   s.final_mean, s.final_rstd),
                         d_final, {}, d_res_, view(grads_, fn_w), d_fn_b, {"final_norm", -1, kB});
}

int GPTModel::backward_entries() const {
  return local_layer_count() + (stage_.has_embedding ? 1 : 0) + (stage_.has_loss ? 1 : 0);
}

void GPTModel::backward(int index) { backward(index, 0, backward_entries()); }

void GPTModel::backward(int index, int begin, int end) {
  const int count = backward_entries();
  if (index < 0 || index >= batch_.num_microbatches || !forward_done_[index])
    throw std::logic_error("backward of a micro-batch whose forward did not run");
  if (begin < 0 || begin > end || end > count)
    throw std::out_of_range("backward: entry range outside the stage");
  const int slot = slot_of(index);
  moe_slot_ = slot;
  Slot& s = slots_[slot];
  const int loss_entries = stage_.has_loss ? 1 : 0;
  if (begin == 0 && !stage_.has_loss) backend_.copy(s.output_grad, d_res_);
  for (int e = begin; e < end; ++e) {
    const int mtp_entries = stage_.num_mtp_layers;
    if (e < loss_entries) {
      loss_backward(slot);
    } else if (e < loss_entries + mtp_entries) {
      mtp_backward(slot, mtp_entries - 1 - (e - loss_entries));  // MTP layers last..first
    } else if (e < loss_entries + mtp_entries + stage_.num_layers) {
      const int i = stage_.num_layers - 1 - (e - loss_entries - mtp_entries);  // layers last..first
      const int l = stage_.first_layer + i;
      LayerActivations& acts = activations_for(slot, i);
      if (config_.mtp_num_layers > 0 && l == config_.num_layers - 1)
        final_norm_backward(slot, stage_.has_loss ? mtp_->d_hidden : s.output_grad);
      if (recompute_ == RecomputeGranularity::kFull)
        layer_forward(l, acts, s.residual[i], s.residual[i + 1],
                      OpPhase::kRecompute);  // as Megatron: the layer
      layer_backward(l, acts, s.residual[i]);
    } else {
      embedding_backward(slot);
    }
  }
  if (end < count) return;
  forward_done_[index] = false;
  if (!stage_.has_embedding)
    backend_.copy(d_res_, s.input_grad);
  else
    slot_of_microbatch_[index] = -1;  // nothing to send: the slot is free
}

void GPTModel::embedding_backward(int slot) {
  const Tensor d_embedding = gather_to_full(d_res_, full_scratch_, "embedding_grad_ag", -1, kB);
  Tensor d_position;
  if (config_.position == PositionEmbedding::kLearned)
    d_position = view(grads_, layout_.find("embedding.position_embeddings.weight"));
  backend_.embedding_backward(slots_[slot].tokens, d_embedding, batch_.seq,
                              view(grads_, layout_.find("embedding.word_embeddings.weight")), d_position,
                              {"embedding", -1, kB}, positions_);
}

std::vector<double> GPTModel::microbatch_losses() {
  std::vector<double> out(batch_.num_microbatches, 0.0);
  if (!stage_.has_loss) return out;
  std::vector<float> host(losses_.numel());
  backend_.download(losses_, host.data());
  const std::int64_t T = batch_.tokens();
  for (int i = 0; i < batch_.num_microbatches; ++i) {
    double sum = 0.0;
    for (std::int64_t t = 0; t < T; ++t) sum += host[i * T + t];
    out[i] = counted_tokens_[i] > 0 ? sum / counted_tokens_[i] : 0.0;
  }
  return out;
}

double GPTModel::evaluate(const MicroBatch& mb) {
  if (!stage_.has_embedding || !stage_.has_loss)
    throw std::logic_error("evaluate: the model must hold the embedding and the loss (one pipeline stage)");
  run_forward(mb, 0, false);
  return microbatch_losses()[0];
}

}  // namespace megatune::executor
