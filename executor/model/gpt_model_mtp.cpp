// GPTModel's multi-token prediction (Megatron's MultiTokenPredictionBlock and process_mtp_loss): for MTP
// layer k on the loss stage, h_k = final_norm_k(TransformerLayer(eh_proj([enorm(embedding(tokens shifted by
// k + 1)) | hnorm(h_{k-1})]))), h_0 the decoder's final norm output (with MTP Megatron applies that norm on
// the last decoder layer's stage); the shared LM head and cross entropy against the labels shifted alike,
// each MTP loss scaled by mtp_loss_scaling_factor / mtp_num_layers into the backward. Also the host shifts
// of mtp_block.h.
#include <algorithm>

#include "executor/model/gpt_model.h"
#include "executor/model/gpt_model_phases.h"
#include "layouts/parameter_table.h"

namespace megatune::executor {
namespace {

using namespace gpt_model_phases;  // NOLINT(google-build-using-namespace)

}  // namespace

std::vector<std::int32_t> shifted_tokens(const std::vector<std::int32_t>& tokens, std::int64_t seq,
                                         int shift) {
  std::vector<std::int32_t> out(tokens.size(), 0);
  for (std::size_t begin = 0; begin < tokens.size(); begin += static_cast<std::size_t>(seq))
    for (std::int64_t i = 0; i + shift < seq; ++i) out[begin + i] = tokens[begin + i + shift];
  return out;
}

std::vector<std::int32_t> shifted_targets(const data::MicroBatch& mb, std::int64_t seq, int shift,
                                          double& counted) {
  std::vector<std::int32_t> out(mb.labels.size(), -1);
  counted = 0.0;
  for (std::size_t begin = 0; begin < mb.labels.size(); begin += static_cast<std::size_t>(seq))
    for (std::int64_t i = 0; i + shift < seq; ++i) {
      if (mb.loss_mask[begin + i + shift] == 0.0f) continue;
      out[begin + i] = mb.labels[begin + i + shift];
      counted += 1.0;
    }
  return out;
}

SequencePositions shifted_positions(std::int64_t seq, int shift) {
  const std::int64_t kept = std::max<std::int64_t>(0, seq - shift);
  SequencePositions runs;
  if (kept > 0) runs.push_back({0, kept, shift});
  if (kept < seq) runs.push_back({kept, seq - kept, 0});
  return runs;
}

StageSpan GPTModel::with_mtp_layers(const TransformerConfig& config, StageSpan stage) {
  if (stage.has_loss && stage.num_mtp_layers == 0) {  // the executor runs every MTP layer with the loss
    stage.first_mtp_layer = 0;
    stage.num_mtp_layers = config.mtp_num_layers;
  }
  return stage;
}

bool GPTModel::holds_last_layer() const {
  return stage_.num_layers > 0 && stage_.first_layer + stage_.num_layers == config_.num_layers;
}

bool GPTModel::sends_its_output() const {
  return !stage_.has_loss && !holds_final_norm() && stage_.num_mtp_layers == 0 &&
         (stage_.num_layers > 0 || stage_.has_embedding);
}

bool GPTModel::holds_final_norm() const {
  return config_.mtp_num_layers > 0 ? holds_last_layer() : stage_.has_loss;
}

int GPTModel::local_index(int layer) const {
  return layer >= 0 ? layer - stage_.first_layer : stage_.num_layers + (-3 - layer - stage_.first_mtp_layer);
}

int GPTModel::global_layer(int local) const {
  return local < stage_.num_layers ? stage_.first_layer + local
                                   : -3 - (stage_.first_mtp_layer + local - stage_.num_layers);
}

std::pair<Tensor, Tensor> GPTModel::norm_weights(Tensor buffer, const std::string& prefix) const {
  Tensor bias;
  if (config_.norm == NormKind::kLayerNorm) bias = view(buffer, layout_.find(prefix + ".bias"));
  return {view(buffer, layout_.find(prefix + ".weight")), bias};
}

void GPTModel::allocate_mtp() {
  const std::int64_t T = shape_.tokens, h = config_.hidden, part = h / tp_size_;
  const int layers = stage_.num_mtp_layers;
  mtp_ = std::make_unique<MtpBuffers>();
  MtpBuffers& m = *mtp_;
  auto hidden = [&](std::int64_t rows, std::int64_t cols) {
    return backend_.allocate(compute_dtype_, rows, cols, "multi-token prediction");
  };
  auto stats = [&] { return backend_.allocate(DType::kFP32, rows_, 1, "multi-token prediction"); };
  m.saved.resize(slots_.size());
  for (std::vector<MtpLayerSaved>& slot : m.saved)
    for (int k = 0; k < layers; ++k) {
      MtpLayerSaved s;
      s.tokens = backend_.allocate_int32(T, 1, "multi-token prediction");
      s.embedding = hidden(rows_, h);
      s.enorm_mean = stats();
      s.enorm_rstd = stats();
      s.hnorm_mean = stats();
      s.hnorm_rstd = stats();
      s.concat = hidden(rows_, 2 * h);
      s.layer_in = hidden(rows_, h);
      s.layer_out = hidden(rows_, h);
      s.final_norm = hidden(rows_, h);
      s.final_mean = stats();
      s.final_rstd = stats();
      s.head_grad = hidden(T, h);
      slot.push_back(s);
    }
  m.norm_out = hidden(rows_, h);
  if (sp()) m.concat_full = hidden(T, 2 * h);
  if (tp_size_ > 1) {
    m.proj_out = hidden(T, part);
    m.proj_gathered = hidden(tp_size_ * T, part);
  }
  m.d_concat_full = hidden(T, 2 * h);
  m.d_concat = sp() ? hidden(rows_, 2 * h) : m.d_concat_full;
  m.d_half = hidden(rows_, h);
  if (layers > 1) m.carry = hidden(rows_, h);
  if (sp()) m.main_head_grad = hidden(rows_, h);
  if (holds_last_layer()) m.d_hidden = hidden(rows_, h);
  m.targets = backend_.allocate_int32(T, 1, "multi-token prediction");
  m.losses = backend_.allocate(DType::kFP32, batch_.num_microbatches * layers, T, "multi-token prediction");
  m.counted.assign(static_cast<std::size_t>(batch_.num_microbatches) * layers, 0.0);
  m.eh_proj_written.assign(layers, false);
}

void GPTModel::final_norm_forward(int slot, OpPhase phase) {
  Slot& s = slots_[slot];
  const auto [w, b] = norm_weights(model_params_, "decoder.final_layernorm");
  const std::size_t n = s.residual.size();
  backend_.norm_forward(
      norm_args(s.residual[n - 2], {}, {}, w, b, s.residual[n - 1], s.final_mean, s.final_rstd),
      {"final_norm", -1, phase});
}

void GPTModel::final_norm_backward(int slot, Tensor d_out) {
  Slot& s = slots_[slot];
  const auto [w, b] = norm_weights(model_params_, "decoder.final_layernorm");
  const auto [dw, db] = norm_weights(grads_, "decoder.final_layernorm");
  const std::size_t n = s.residual.size();
  backend_.norm_backward(
      norm_args(s.residual[n - 2], {}, {}, w, b, s.residual[n - 1], s.final_mean, s.final_rstd), d_out, {},
      d_res_, dw, db, {"final_norm", -1, kB});
}

void GPTModel::mtp_forward(const MicroBatch& mb, int index, int slot, bool with_gradients) {
  const std::int64_t h = config_.hidden, storage = backend_.storage_bytes(compute_dtype_);
  const int layers = stage_.num_mtp_layers;
  Tensor previous = slots_[slot].residual.back();  // h_0: the decoder's final norm output
  for (int d = 0; d < layers; ++d) {
    const int k = stage_.first_mtp_layer + d, l = -3 - k, shift = k + 1;
    MtpLayerSaved& m = mtp_->saved[slot][d];
    embed_tokens(shifted_tokens(mb.tokens, batch_.seq, shift), m.tokens, m.embedding,
                 shifted_positions(batch_.seq, shift), l);
    const auto [ew, eb] = norm_weights(model_params_, layouts::mtp_parameter(k, "enorm"));
    backend_.norm_forward(norm_args(m.embedding, {}, {}, ew, eb, mtp_->norm_out, m.enorm_mean, m.enorm_rstd),
                          {"mtp_enorm", l, kF});
    backend_.copy(mtp_->norm_out, columns_of(m.concat, 0, h, storage));
    const auto [hw, hb] = norm_weights(model_params_, layouts::mtp_parameter(k, "hnorm"));
    backend_.norm_forward(norm_args(previous, {}, {}, hw, hb, mtp_->norm_out, m.hnorm_mean, m.hnorm_rstd),
                          {"mtp_hnorm", l, kF});
    backend_.copy(mtp_->norm_out, columns_of(m.concat, h, h, storage));
    eh_proj_forward(k, m);
    layer_forward(l, activations_for(slot, stage_.num_layers + d), m.layer_in, m.layer_out, kF);
    const auto [fw, fb] = norm_weights(model_params_, layouts::mtp_parameter(k, "final_layernorm"));
    backend_.norm_forward(norm_args(m.layer_out, {}, {}, fw, fb, m.final_norm, m.final_mean, m.final_rstd),
                          {"final_norm", l, kF});
    double counted = 0.0;
    const std::vector<std::int32_t> targets = shifted_targets(mb, batch_.seq, shift, counted);
    const int row = index * layers + d;
    mtp_->counted[row] = counted;
    backend_.upload_int32(mtp_->targets, targets.data());
    // Megatron: mtp_loss_scaling_factor / mtp_num_layers times the mean over the counted tokens, averaged
    // over the micro-batches and the data-parallel ranks like the main loss.
    const double scale = config_.mtp_loss_scaling_factor / config_.mtp_num_layers;
    const float grad_scale =
        counted > 0
            ? static_cast<float>(scale / (counted * batch_.num_microbatches * batch_.gradient_average_ranks))
            : 0.0f;
    head_and_loss(mtp_heads_.at(d), m.final_norm, mtp_->targets, rows_of(mtp_->losses, row, 1, 4), grad_scale,
                  m.head_grad, with_gradients, l);
    previous = m.final_norm;
  }
}

void GPTModel::eh_proj_forward(int k, MtpLayerSaved& m) {
  // Column-parallel 2h -> h (Megatron's eh_proj: gather_output false), then its output gathered over TP
  // along the hidden dimension and, under SP, this rank's sequence rows kept (the scatter).
  eh_proj_.at(k - stage_.first_mtp_layer)
      .forward_gathered_output(m.concat, mtp_->concat_full, mtp_->proj_out, mtp_->proj_gathered, m.layer_in,
                               kF);
}

void GPTModel::mtp_backward(int slot, int d) {
  const int k = stage_.first_mtp_layer + d, l = -3 - k;
  const std::int64_t h = config_.hidden, storage = backend_.storage_bytes(compute_dtype_);
  MtpLayerSaved& m = mtp_->saved[slot][d];
  Slot& s = slots_[slot];
  // The gradient of this layer's final norm output: from the head, plus the next MTP layer's hnorm.
  const Tensor d_final = mtp_heads_.at(d).reduce_input_grad(m.head_grad, d_hidden_shard_);
  if (k < config_.mtp_num_layers - 1) backend_.add(d_final, mtp_->carry, d_final, {"mtp_grad_add", l, kB});
  const auto [fw, fb] = norm_weights(model_params_, layouts::mtp_parameter(k, "final_layernorm"));
  const auto [dfw, dfb] = norm_weights(grads_, layouts::mtp_parameter(k, "final_layernorm"));
  backend_.norm_backward(norm_args(m.layer_out, {}, {}, fw, fb, m.final_norm, m.final_mean, m.final_rstd),
                         d_final, {}, d_res_, dfw, dfb, {"final_norm", l, kB});
  LayerActivations& acts = activations_for(slot, stage_.num_layers + d);
  if (plan_.unit_ending_at(l) != nullptr)  // Megatron checkpoints an MTP layer alone (uniform only)
    layer_forward(l, acts, m.layer_in, m.layer_out, OpPhase::kRecompute);
  layer_backward(l, acts, m.layer_in, plan_.at(l) == layouts::LayerRecompute::kUnitLast);
  const Tensor d_concat = eh_proj_backward(d, m);
  // hnorm: the first MTP layer's input is h_0, whose gradient also holds the main head's (the residual).
  const Tensor previous = d == 0 ? s.residual.back() : mtp_->saved[slot][d - 1].final_norm;
  Tensor d_previous = mtp_->carry, d_residual;
  if (k == 0) {
    d_previous = holds_last_layer() ? mtp_->d_hidden : d_res_;
    d_residual = sp() ? mtp_->main_head_grad : s.head_grad;
  }
  backend_.copy(columns_of(d_concat, h, h, storage), mtp_->d_half);
  const auto [hw, hb] = norm_weights(model_params_, layouts::mtp_parameter(k, "hnorm"));
  const auto [dhw, dhb] = norm_weights(grads_, layouts::mtp_parameter(k, "hnorm"));
  backend_.norm_backward(norm_args(previous, {}, {}, hw, hb, mtp_->norm_out, m.hnorm_mean, m.hnorm_rstd),
                         mtp_->d_half, d_residual, d_previous, dhw, dhb, {"mtp_hnorm", l, kB});
  backend_.copy(columns_of(d_concat, 0, h, storage), mtp_->d_half);
  const auto [ew, eb] = norm_weights(model_params_, layouts::mtp_parameter(k, "enorm"));
  const auto [dew, deb] = norm_weights(grads_, layouts::mtp_parameter(k, "enorm"));
  backend_.norm_backward(norm_args(m.embedding, {}, {}, ew, eb, mtp_->norm_out, m.enorm_mean, m.enorm_rstd),
                         mtp_->d_half, {}, d_mid_, dew, deb, {"mtp_enorm", l, kB});
  mtp_embedding_backward(k, m, d_mid_);
}

Tensor GPTModel::eh_proj_backward(int d, MtpLayerSaved& m) {
  // d_res_ holds the gradient of eh_proj's (gathered, scattered) output: gathered over the sequence under
  // SP (the scatter's backward), this rank's hidden columns are the GEMMs' output gradient.
  const TensorParallelLinear& eh_proj = eh_proj_.at(d);
  const Tensor dy = eh_proj.gathered_output_grad(d_res_, full_scratch_);
  const bool accumulate = mtp_->eh_proj_written[d];
  mtp_->eh_proj_written[d] = true;
  return eh_proj.backward({.dy = dy,
                           .x = m.concat,
                           .x_full = mtp_->concat_full,
                           .dx = mtp_->d_concat_full,
                           .dx_shard = mtp_->d_concat},
                          accumulate);
}

void GPTModel::mtp_embedding_backward(int k, const MtpLayerSaved& m, Tensor d_embedding) {
  const int l = -3 - k;
  const Tensor d_full = tp_.gather_sequence(d_embedding, full_scratch_, "embedding_grad_ag", l, kB);
  Tensor d_position;
  if (config_.position == PositionEmbedding::kLearned)
    d_position = view(grads_, layout_.find("embedding.position_embeddings.weight"));
  backend_.embedding_backward(m.tokens, d_full, batch_.seq,
                              view(grads_, layout_.find("embedding.word_embeddings.weight")), d_position,
                              {"embedding", l, kB}, shifted_positions(batch_.seq, k + 1));
}

std::vector<double> GPTModel::mtp_losses() {
  if (!mtp_) return {};
  const int layers = stage_.num_mtp_layers;
  std::vector<float> host(mtp_->losses.numel());
  backend_.download(mtp_->losses, host.data());
  const std::int64_t T = shape_.tokens;
  std::vector<double> out(layers, 0.0);
  for (int i = 0; i < batch_.num_microbatches; ++i)
    for (int d = 0; d < layers; ++d) {
      const int row = i * layers + d;
      double sum = 0.0;
      for (std::int64_t t = 0; t < T; ++t) sum += host[row * T + t];
      if (mtp_->counted[row] > 0) out[d] += sum / mtp_->counted[row] / batch_.num_microbatches;
    }
  return out;
}

}  // namespace megatune::executor
