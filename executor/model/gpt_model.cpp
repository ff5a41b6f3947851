// GPTModel: buffers and the layers of the decoder LM over a Backend (the passes segment by segment in
// gpt_model_passes.cpp, parameters in gpt_model_parameters.cpp, core attention in gpt_model_attention.cpp,
// the LM head and loss in gpt_model_loss.cpp, multi-token prediction in gpt_model_mtp.cpp).
#include "executor/model/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>

#include "base/user_error.h"
#include "executor/model/gpt_model_phases.h"
#include "executor/parallel/context_parallel_split.h"
#include "executor/parallel/state_labels.h"
#include "layouts/step_program.h"

namespace megatune::executor {
namespace {

// A norm recomputed in the backward from the statistics its forward stored (NormArgs::stats_given).
NormArgs with_stats(NormArgs a) {
  a.stats_given = true;
  return a;
}

using namespace gpt_model_phases;  // NOLINT(google-build-using-namespace)

}  // namespace

GPTModel::GPTModel(const TransformerConfig& config, const BatchShape& batch,
                   const layouts::RecomputeSettings& recompute, DType compute_dtype, Backend& backend,
                   Communicator& communicator, const StageSpan& stage)
    : config_(config),
      batch_(batch),
      recompute_(recompute),
      compute_dtype_(compute_dtype),
      backend_(backend),
      communicator_(communicator),
      tp_(backend, communicator, config.sequence_parallel),
      stage_(with_mtp_layers(config, stage)),
      layout_(config, stage_, batch.bucketing) {
  config_.validate();
  if (stage_.num_layers < 0) stage_.num_layers = config_.num_layers - stage_.first_layer;
  if (stage_.first_layer < 0 || stage_.first_layer + stage_.num_layers > config_.num_layers)
    throw std::invalid_argument("GPTModel: stage layers outside the model");
  {
    std::vector<int> decoder, mtp;
    for (int i = 0; i < stage_.num_layers; ++i) decoder.push_back(stage_.first_layer + i);
    for (int k = 0; k < stage_.num_mtp_layers; ++k) mtp.push_back(-3 - (stage_.first_mtp_layer + k));
    plan_ = layouts::plan_recompute(recompute_, decoder, mtp);
  }
  tp_rank_ = tp_.rank();
  tp_size_ = tp_.size();
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
  shape_ = rank_shape(config_, batch_.micro_batch, batch_.seq, cp_size_);
  batch_.seq /= cp_size_;
  const std::int64_t T = shape_.tokens, h = config_.hidden, total = layout_.total_elements();
  if (sp() && T % tp_size_ != 0)
    throw UserError("--sequence-parallel: micro-batch tokens (" + std::to_string(T) +
                    ") must divide by --tensor-model-parallel-size " + std::to_string(tp_size_));
  rows_ = shape_.tokens_sp;
  if (config_.mla && cp_size_ > 1)
    throw UserError("--multi-latent-attention with --context-parallel-size " + std::to_string(cp_size_) +
                    ": the executor runs multi-latent attention without context parallelism; use "
                    "--context-parallel-size 1");
  if (config_.mla) mla_ = std::make_unique<MlaAttention>(config_, shape_, compute_dtype_, backend_, tp_);
  require_attention_support();
  if (config_.qk_layernorm) {
    const std::string gap = backend_.norm_unsupported(config_.head_dim);
    if (!gap.empty())
      throw UserError("--qk-layernorm: the " + backend_.name() + " backend cannot normalize heads of " +
                      std::to_string(config_.head_dim) + " (--kv-channels): " + gap +
                      "; pick a head dimension it takes, or --device cpu");
  }
  if (cp_size_ > 1 && stage_.num_layers > 0)
    ring_ = std::make_unique<RingAttention>(ring_shape(), compute_dtype_, backend_, communicator_);
  index_layer_parameters();
  if (batch_.activation_slots < 1) throw std::invalid_argument("GPTModel: activation_slots must be >= 1");
  // The compute-dtype copy covers every parameter a GEMM or norm reads. An untied word embedding (and the
  // learned positions) is only gathered: the lookup reads the fp32 main parameters and no copy is kept. The
  // buffer order is Megatron's (reversed): the embedding tables are the last elements, so the copy is the
  // buffer's first model_copy_elements_. An fp32 model's parameters are its main parameters.
  const bool fp32 = compute_dtype_ == DType::kFP32;
  if (keeps_main_parameters())
    main_params_ = backend_.allocate(DType::kFP32, 1, total, state_label::kMainParams);
  model_copy_elements_ = total;
  if (!fp32 && !config_.tied_embeddings && stage_.has_embedding && !batch_.main_parameters_sharded) {
    const bool learned = config_.position == PositionEmbedding::kLearned;
    model_copy_elements_ = layout_.entries()[learned ? 1 : 0].offset;
  }
  gathered_at_use_ = batch_.parameters_gathered_at_use && batch_.main_parameters_sharded && !fp32 &&
                     stage_.num_mtp_layers == 0;
  if (gathered_at_use_) {
    model_params_.dtype = compute_dtype_;
    model_params_.rows = 1;
    model_params_.cols = model_params_.row_stride = model_copy_elements_;
  } else {
    model_params_ =
        fp32 ? main_params_
             : backend_.allocate(compute_dtype_, 1, model_copy_elements_, state_label::kModelParams);
  }
  grads_sharded_ = batch_.gradients_sharded && batch_.main_parameters_sharded && stage_.num_mtp_layers == 0;
  if (grads_sharded_) {  // the strategy holds the shard and places each bucket's slot
    grads_.dtype = DType::kFP32;
    grads_.rows = 1;
    grads_.cols = grads_.row_stride = total;
  } else {
    grads_ = backend_.allocate(DType::kFP32, 1, total, state_label::kMainGrads);
  }
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
    if (grads_sharded_) break;  // a placed slot is zero
    if (begin > next) zeroed_grads_.push_back(carve(grads_, next, 1, begin - next, 4));
    next = std::max(next, end);
  }
  layer_grads_written_.assign(local_layer_count(), false);
  if (grads_.data != nullptr && total > 0) backend_.fill_zero(grads_);  // once: the GEMM weights' ranges too

  const int L = local_layer_count();
  const bool mtp_final_norm = config_.mtp_num_layers > 0 && holds_last_layer();
  slots_.resize(batch_.activation_slots);
  // Full recomputation saves a unit's input only: the inputs of its later layers are shared buffers that the
  // forward and the unit's re-run pass through.
  for (int p = 1; p < plan_.largest_unit(); ++p)
    unit_residuals_.push_back(
        backend_.allocate(compute_dtype_, rows_, h, "recomputed unit's inner layer inputs (shared)"));
  const auto position_in_unit = [&](int layer) {
    const layouts::RecomputeUnit* unit = plan_.unit_of(layer);
    if (unit == nullptr) return 0;
    return static_cast<int>(std::find(unit->layers.begin(), unit->layers.end(), layer) -
                            unit->layers.begin());
  };
  // A stage that sends its last layer's output needs it only until the send (which returns once the transfer
  // is done, or is ordered before later compute on its stream), and no backward reads it: one buffer serves
  // every slot, as Megatron frees a pipeline output after sending it (deallocate_output_tensor).
  const bool one_output = sends_its_output();
  if (one_output)
    stage_output_ =
        backend_.allocate(compute_dtype_, rows_, h, "pipeline stage output (one, freed after send)");
  for (Slot& slot : slots_)
    for (int l = 0; l <= stage_.num_layers + (mtp_final_norm ? 1 : 0); ++l) {
      const int position = l < stage_.num_layers ? position_in_unit(stage_.first_layer + l) : 0;
      if (l == stage_.num_layers && one_output) {
        slot.residual.push_back(stage_output_);
        continue;
      }
      slot.residual.push_back(
          position > 0 ? unit_residuals_[position - 1]
                       : backend_.allocate(compute_dtype_, rows_, h, "residual stream (layer inputs)"));
    }
  // Buffers shared by every layer. mlp_scratch_ holds, in turn: the activation output (forward), in backward
  // fc2's data gradient and then the recomputed activation output, then the attention output gradient and
  // the qkv gradient side by side.
  const std::int64_t ffn = shape_.ffn_per_rank(), attn_w = shape_.attention_width(),
                     qkv_w = shape_.qkv_width(), storage = backend_.storage_bytes(compute_dtype_);
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
  // Selective recomputation re-runs the core attention into one shared output; otherwise each set keeps its
  // own (a unit's re-run produces every layer's before their backwards).
  const bool keep_attention = recompute_.granularity != RecomputeGranularity::kSelective;
  // An MoE layer's MLP keeps its own rows (moe_layer.h): no dense fc1 output for it.
  auto dense_mlp = [&](int l) { return layer_parameters_.at(l).moe_local < 0; };
  {
    bool any_dense = false;
    for (int l = 0; l < L; ++l) any_dense = any_dense || (plan_.recomputed(global_layer(l)) && dense_mlp(l));
    for (int p = 0; p < plan_.largest_unit(); ++p)
      unit_sets_.push_back(allocate_layer_activations(keep_attention, any_dense));
  }
  for (Slot& slot : slots_)
    for (int l = 0; l < L; ++l)
      slot.saved.push_back(plan_.recomputed(global_layer(l))
                               ? LayerActivations{}
                               : allocate_layer_activations(keep_attention, dense_mlp(l)));
  if (!keep_attention && L > 0) {
    shared_attn_ = backend_.allocate(compute_dtype_, T, attn_w, "recomputed attention (shared)");
    shared_lse_ = backend_.allocate(DType::kFP32, batch_.micro_batch * shape_.heads_per_rank(), batch_.seq,
                                    "recomputed attention (shared)");
    const Tensor shared_kv =
        cp_size_ > 1 ? backend_.allocate(compute_dtype_, T, 2 * shape_.groups_per_rank() * config_.head_dim,
                                         "recomputed attention (shared)")
                     : Tensor{};
    auto share = [&](LayerActivations& acts) {
      acts.attn = shared_attn_;
      acts.lse = shared_lse_;
      acts.cp_kv = shared_kv;
    };
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
    loss_chunk_rows_ = layouts::loss_chunk_rows(T, shape_.vocab_per_rank(), batch_.loss_chunk_logits_bytes);
    logits_ = backend_.allocate(compute_dtype_, loss_chunk_rows_, shape_.vocab_per_rank(),
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
  if (config_.qk_layernorm) {
    const std::int64_t head_rows = T * shape_.heads_per_rank();  // heads >= groups
    qk_norm_out_ = backend_.allocate(compute_dtype_, head_rows, config_.head_dim, "qk head norms (shared)");
    qk_norm_grad_ = backend_.allocate(compute_dtype_, head_rows, config_.head_dim, "qk head norms (shared)");
  }
  int moe_count = 0;
  for (const LayerParameters& p : layer_parameters_) moe_count += p.moe_local >= 0 ? 1 : 0;
  if (moe_count > 0)
    moe_ = std::make_unique<MoeLayers>(config_, shape_, moe_count, batch_.activation_slots, compute_dtype_,
                                       backend_, communicator_);
  if (stage_.num_mtp_layers > 0) allocate_mtp();
  microbatch_capacity_ = batch_.num_microbatches;
  counted_tokens_.assign(batch_.num_microbatches, 0.0);
  slot_of_microbatch_.assign(batch_.num_microbatches, -1);
  forward_done_.assign(batch_.num_microbatches, false);

  Backend::ScratchNeeds needs;
  needs.tokens = T;
  needs.hidden = h;
  needs.max_bias_cols = std::max({h, shape_.qkv_width(), shape_.fc1_width()});
  if (config_.qk_layernorm) {
    needs.head_norm_rows = T * shape_.heads_per_rank();
    needs.head_norm_width = config_.head_dim;
  }
  needs.vocab = shape_.vocab_per_rank();
  needs.attention = attention_args(L > 0 ? activations_for(0, 0) : LayerActivations{});
  const std::int64_t scratch_bytes = backend_.scratch_bytes(needs);
  if (scratch_bytes > 0)
    backend_.set_scratch(backend_.allocate(DType::kFP32, 1, (scratch_bytes + 3) / 4, "kernel scratch"));
  build_linears();
  if (config_.fp8.enabled()) setup_fp8();
  placed_views_required_ = gathered_at_use_ || grads_sharded_;  // from here on only what is placed
}

GPTModel::LayerActivations GPTModel::allocate_layer_activations(bool with_attention, bool dense_mlp) {
  const std::int64_t T = shape_.tokens, h = config_.hidden;
  LayerActivations a;
  a.ln1 = norm1_out_;
  a.ln1_mean = backend_.allocate(DType::kFP32, rows_, 1, "saved: norm statistics");
  a.ln1_rstd = backend_.allocate(DType::kFP32, rows_, 1, "saved: norm statistics");
  if (mla_)
    a.mla = mla_->allocate_saved();
  else
    a.qkv = backend_.allocate(compute_dtype_, T, shape_.qkv_width(), "saved: qkv");
  if (config_.qk_layernorm) allocate_qk_norm_saved(a);
  if (with_attention) {
    a.attn = backend_.allocate(compute_dtype_, T, shape_.attention_width(), "saved: attention output");
    a.lse = backend_.allocate(DType::kFP32, batch_.micro_batch * shape_.heads_per_rank(), batch_.seq,
                              "saved: attention output");
    if (cp_size_ > 1)
      a.cp_kv = backend_.allocate(compute_dtype_, T, 2 * shape_.groups_per_rank() * config_.head_dim,
                                  "saved: context-parallel K,V block");
  }
  a.mid = backend_.allocate(compute_dtype_, rows_, h, "saved: mid residual");
  a.ln2 = norm2_out_;
  a.ln2_mean = backend_.allocate(DType::kFP32, rows_, 1, "saved: norm statistics");
  a.ln2_rstd = backend_.allocate(DType::kFP32, rows_, 1, "saved: norm statistics");
  if (dense_mlp)
    a.fc1 = backend_.allocate(compute_dtype_, T, shape_.fc1_width(), "saved: fc1 output (pre-activation)");
  a.act = carve(mlp_scratch_, 0, T, shape_.ffn_per_rank(), backend_.storage_bytes(compute_dtype_));
  return a;
}

void GPTModel::moe_mlp_backward(int l, LayerActivations& a, Tensor d_out, Tensor d_in, bool accumulate,
                                bool norms_fresh) {
  // On the sequence shard (moe_layer.h): the routed experts' backward, then the recompute of the block's
  // input (the pre-MLP norm output, unless a full-recompute re-run of the layer has just written it) that
  // the shared expert's and the router's weight gradients read.
  const MoeLayerLinears w = moe_linears(l);
  const int local = layer_parameters_.at(local_index(l)).moe_local;
  moe_->backward_routed(w, d_out, d_in, moe_slot_, local, l, accumulate);
  const LayerWeights n = layer_weights(model_params_, l);
  if (!norms_fresh)
    backend_.norm_forward(
        with_stats(norm_args(a.mid, {}, {}, n.norm2_w, n.norm2_b, norm2_shard_, a.ln2_mean, a.ln2_rstd)),
        {"pre_mlp_norm", l, OpPhase::kRecompute});
  const float aux_loss_scale =
      static_cast<float>(1.0 / (batch_.num_microbatches * batch_.gradient_average_ranks));
  moe_->backward_dense(w, norm2_shard_, a.ln2, d_out, d_in, moe_slot_, local, l, accumulate, aux_loss_scale);
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

void GPTModel::set_num_microbatches(int count) {
  if (count < 1 || count > microbatch_capacity_)
    throw std::invalid_argument("GPTModel::set_num_microbatches: " + std::to_string(count) +
                                " micro-batches, the model holds 1 to " +
                                std::to_string(microbatch_capacity_));
  for (int i = 0; i < batch_.num_microbatches; ++i)
    if (slot_of_microbatch_[i] >= 0 || forward_done_[i])
      throw std::logic_error("GPTModel::set_num_microbatches inside an iteration");
  batch_.num_microbatches = count;
  counted_tokens_.assign(count, 0.0);
  slot_of_microbatch_.assign(count, -1);
  forward_done_.assign(count, false);
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

GPTModel::LayerActivations& GPTModel::activations_for(int slot, int local_layer) {
  const int layer = global_layer(local_layer);
  const layouts::RecomputeUnit* unit = plan_.unit_of(layer);
  if (unit == nullptr) return slots_[slot].saved[local_layer];
  return unit_sets_.at(std::find(unit->layers.begin(), unit->layers.end(), layer) - unit->layers.begin());
}

void GPTModel::recompute_unit_ending_at(int layer, int slot) {
  const layouts::RecomputeUnit* unit = plan_.unit_ending_at(layer);
  if (unit == nullptr) return;
  Slot& s = slots_[slot];
  for (int l : unit->layers) {  // decoder layers (an MTP layer's unit is itself: mtp_backward re-runs it)
    const int i = local_index(l);
    layer_forward(l, activations_for(slot, i), s.residual[i], s.residual[i + 1], OpPhase::kRecompute);
  }
}

void GPTModel::layer_forward(int l, LayerActivations& a, Tensor input, Tensor output, OpPhase phase) {
  const LayerWeights w = layer_weights(model_params_, l);
  const LayerLinears& lin = layer_linears_.at(local_index(l));
  backend_.norm_forward(norm_args(input, {}, {}, w.norm1_w, w.norm1_b, norm1_shard_, a.ln1_mean, a.ln1_rstd),
                        {"input_norm", l, phase});
  if (mla_) {
    mla_->forward(l, mla_weights(l), norm1_shard_, a.ln1, a.mla, phase);
  } else {
    lin.qkv->forward(norm1_shard_, a.ln1, a.qkv, {}, phase);
    if (config_.qk_layernorm) qk_norm_forward(l, a, phase);
    if (config_.position == PositionEmbedding::kRope)
      backend_.rope(a.qkv, batch_.seq, shape_.heads_per_rank(), shape_.groups_per_rank(), config_.head_dim,
                    config_.rope_theta, false, {"rope", l, phase}, positions_);
  }
  core_attention_forward(a, l, phase);
  const Tensor proj = lin.proj->forward(a.attn, {}, fc2_out_, reduced_, phase);
  // The residual add fused into the pre-MLP norm: a.mid = bf16(proj output + input), a.ln2 = norm(a.mid).
  backend_.norm_forward(
      norm_args(proj, input, a.mid, w.norm2_w, w.norm2_b, norm2_shard_, a.ln2_mean, a.ln2_rstd),
      {"pre_mlp_norm", l, phase});
  const int moe_local = layer_parameters_.at(local_index(l)).moe_local;
  if (moe_local >= 0) {  // on the sequence shard (moe_layer.h)
    moe_->forward(moe_linears(l), norm2_shard_, a.ln2, reduced_, moe_slot_, moe_local, l, phase);
    backend_.add(a.mid, reduced_, output, {"residual2", l, phase});
    return;
  }
  const Tensor fc1_in = lin.fc1->gather_input(norm2_shard_, a.ln2, phase);
  if (config_.activation == ActivationKind::kGelu) {
    // fc1 with bias and GELU fused in the GEMM's epilogue; a.fc1 keeps the pre-activation for the backward.
    lin.fc1->forward_gemm_gelu(fc1_in, a.fc1, a.act, phase);
  } else {
    lin.fc1->forward_gemm(fc1_in, a.fc1, phase);
    backend_.activation_forward(config_.activation, a.fc1, a.act, {"act", l, phase});
  }
  const Tensor fc2 = lin.fc2->forward(a.act, {}, fc2_out_, reduced_, phase);
  backend_.add(a.mid, fc2, output, {"residual2", l, phase});
}

void GPTModel::layer_backward(int l, LayerActivations& a, Tensor input, bool norms_fresh) {
  const LayerWeights w = layer_weights(model_params_, l);
  const LayerWeights g = layer_weights(grads_, l);
  const int local = local_index(l);
  const LayerLinears& lin = layer_linears_.at(local);
  // The shared norm outputs hold another layer's values unless the re-run of this layer's unit has just
  // written them (it is the unit's last layer).
  const bool recompute_shared = !norms_fresh;
  const OpPhase kR = OpPhase::kRecompute;
  // The linears' weight gradients go into the fp32 grad buffer, overwriting on the iteration's first write.
  const bool accumulate = layer_grads_written_[local];
  layer_grads_written_[local] = true;
  // MLP. d_res_ holds the gradient of the layer output (its sequence shard under SP, gathered for the GEMMs).
  // fc2's data gradient goes to the shared activation buffer; one pass then turns it into fc1's output
  // gradient (in place over the saved fc1 output, which nothing reads afterwards) and recomputes the
  // activation output (in place over the data gradient) for fc2's weight gradient.
  Tensor d_ln2 = d_hidden_shard_;
  if (layer_is_moe(l)) {
    moe_mlp_backward(l, a, d_res_, d_ln2, accumulate, norms_fresh);
  } else {
    const Tensor d_out = lin.fc2->gather_output_grad(d_res_, full_scratch_);
    lin.fc2->data_grad(d_out, a.act);
    backend_.activation_backward_recompute(config_.activation, a.fc1, a.act, a.fc1, a.act, {"act", l, kB});
    lin.fc2->weight_grad(d_out, a.act, accumulate);
    if (recompute_shared)
      backend_.norm_forward(
          with_stats(norm_args(a.mid, {}, {}, w.norm2_w, w.norm2_b, norm2_shard_, a.ln2_mean, a.ln2_rstd)),
          {"pre_mlp_norm", l, kR});
    d_ln2 = lin.fc1->backward(
        {.dy = a.fc1, .x = norm2_shard_, .x_full = a.ln2, .dx = d_hidden_, .dx_shard = d_hidden_shard_},
        accumulate);
  }

  backend_.norm_backward(norm_args(a.mid, {}, {}, w.norm2_w, w.norm2_b, norm2_shard_, a.ln2_mean, a.ln2_rstd),
                         d_ln2, d_res_, d_mid_, g.norm2_w, g.norm2_b, {"pre_mlp_norm", l, kB});
  // Attention.
  if (recompute_.granularity == RecomputeGranularity::kSelective) core_attention_forward(a, l, kR);
  lin.proj->backward({.dy = d_mid_, .dy_full = full_scratch_, .x = a.attn, .dx = d_attn_}, accumulate);
  if (mla_) {
    mla_backward(l, a, input, accumulate, norms_fresh);
  } else {
    core_attention_backward(a, l);
    if (config_.position == PositionEmbedding::kRope)
      backend_.rope(d_qkv_, batch_.seq, shape_.heads_per_rank(), shape_.groups_per_rank(), config_.head_dim,
                    config_.rope_theta, true, {"rope", l, kB}, positions_);
    if (config_.qk_layernorm) qk_norm_backward(l, a);
    if (recompute_shared)
      backend_.norm_forward(
          with_stats(norm_args(input, {}, {}, w.norm1_w, w.norm1_b, norm1_shard_, a.ln1_mean, a.ln1_rstd)),
          {"input_norm", l, kR});
    lin.qkv->backward(
        {.dy = d_qkv_, .x = norm1_shard_, .x_full = a.ln1, .dx = d_hidden_, .dx_shard = d_hidden_shard_},
        accumulate);
  }
  const Tensor d_ln1 = d_hidden_shard_;  // the input norm output's gradient
  backend_.norm_backward(norm_args(input, {}, {}, w.norm1_w, w.norm1_b, norm1_shard_, a.ln1_mean, a.ln1_rstd),
                         d_ln1, d_mid_, d_res_, g.norm1_w, g.norm1_b, {"input_norm", l, kB});
}

void GPTModel::mla_backward(int l, LayerActivations& a, Tensor input, bool accumulate, bool norms_fresh) {
  const LayerWeights w = layer_weights(model_params_, l);
  if (!norms_fresh)
    backend_.norm_forward(
        with_stats(norm_args(input, {}, {}, w.norm1_w, w.norm1_b, norm1_shard_, a.ln1_mean, a.ln1_rstd)),
        {"input_norm", l, OpPhase::kRecompute});
  mla_->backward(l, mla_weights(l), a.mla, a.attn, a.lse, d_attn_, norm1_shard_, a.ln1, d_hidden_shard_,
                 sp() ? d_hidden_ : d_hidden_shard_, accumulate);
}

void GPTModel::embedding_forward(const MicroBatch& mb, int slot) {
  embed_tokens(mb.tokens, slots_[slot].tokens, slots_[slot].residual.front(), positions_, -1);
}

void GPTModel::embed_tokens(const std::vector<std::int32_t>& global_ids, Tensor tokens, Tensor output,
                            const SequencePositions& positions, int layer) {
  // Vocab-parallel: this rank's slice of the vocabulary holds ids [offset, offset + V / tp); other ids look
  // up a zero row (-1) and the all-reduce (or reduce-scatter under SP) over TP sums the slices. Learned
  // positions are added once, on TP rank 0.
  const std::int64_t T = shape_.tokens, vocab = shape_.vocab_per_rank(), offset = tp_rank_ * vocab;
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
  tp_.reduce(full, output, "embedding_ar", "embedding_rs", layer, kF);
}

void GPTModel::embedding_backward(int slot) {
  const Tensor d_embedding = tp_.gather_sequence(d_res_, full_scratch_, "embedding_grad_ag", -1, kB);
  Tensor d_position;
  if (config_.position == PositionEmbedding::kLearned)
    d_position = view(grads_, layout_.find("embedding.position_embeddings.weight"));
  backend_.embedding_backward(slots_[slot].tokens, d_embedding, batch_.seq,
                              view(grads_, layout_.find("embedding.word_embeddings.weight")), d_position,
                              {"embedding", -1, kB}, positions_);
}

}  // namespace megatune::executor
