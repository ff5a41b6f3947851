// GPTModel: buffers, initialization, and the forward/backward passes of the decoder LM over a Backend.
#include "executor/model/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>

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

// The three GEMMs of a linear layer with weight (out, in) over m tokens (layouts/step_program.h's shapes):
// y = x . W^T (+ bias); dx = dy . W; dW (+)= dy^T . x into the fp32 grad buffer (+ the bias gradient).
GemmArgs linear_forward_args(Tensor x, Tensor weight, Tensor y, Tensor bias, std::int64_t m) {
  GemmArgs g;
  g.a = x;
  g.b = weight;
  g.transpose_b = true;
  g.c = y;
  g.bias = bias;
  g.m = m;
  g.n = weight.rows;
  g.k = weight.cols;
  return g;
}
GemmArgs linear_data_grad_args(Tensor dy, Tensor weight, Tensor dx, std::int64_t m) {
  GemmArgs g;
  g.a = dy;
  g.b = weight;
  g.c = dx;
  g.m = m;
  g.n = weight.cols;
  g.k = weight.rows;
  return g;
}
GemmArgs linear_weight_grad_args(Tensor dy, Tensor x, Tensor weight, Tensor d_weight, Tensor d_bias,
                                 std::int64_t tokens) {
  GemmArgs g;
  g.a = dy;
  g.transpose_a = true;
  g.b = x;
  g.c = d_weight;
  g.bias_grad = d_bias;
  g.m = weight.rows;
  g.n = weight.cols;
  g.k = tokens;
  g.accumulate = true;
  return g;
}

Tensor rows_of(Tensor t, std::int64_t first_row, std::int64_t rows, std::int64_t storage_bytes) {
  Tensor v = t;
  v.data = static_cast<char*>(t.data) + first_row * t.row_stride * storage_bytes;
  v.rows = rows;
  return v;
}

// A (rows, cols) contiguous view `offset` elements into a flat buffer (null data stays null: sizing mode).
Tensor carve(Tensor buffer, std::int64_t offset, std::int64_t rows, std::int64_t cols,
             std::int64_t storage_bytes) {
  if (offset + rows * cols > buffer.numel()) throw std::logic_error("carve: view exceeds its buffer");
  Tensor v = buffer;
  if (buffer.data != nullptr) v.data = static_cast<char*>(buffer.data) + offset * storage_bytes;
  v.rows = rows;
  v.cols = cols;
  v.row_stride = cols;
  return v;
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

GPTModel::GPTModel(const TransformerConfig& config, const BatchShape& batch, RecomputeGranularity recompute,
                   DType compute_dtype, Backend& backend, Communicator& communicator)
    : config_(config),
      batch_(batch),
      recompute_(recompute),
      compute_dtype_(compute_dtype),
      backend_(backend),
      communicator_(communicator),
      layout_(config) {
  config_.validate();
  if (config_.tensor_parallel_size != 1 || communicator_.size(CommGroup::kTensor) != 1)
    throw UserError(
        "the executor runs --tensor-model-parallel-size 1 only so far; plan TP layouts with `megatune plan`");
  if (batch_.seq > config_.max_seq && config_.position == PositionEmbedding::kLearned)
    throw UserError("--seq-length " + std::to_string(batch_.seq) + " exceeds --max-position-embeddings " +
                    std::to_string(config_.max_seq));
  const std::int64_t T = batch_.tokens(), h = config_.hidden, total = layout_.total_elements();
  main_params_ = backend_.allocate(DType::kFP32, 1, total, "fp32 main parameters");
  // The compute-dtype copy covers every parameter a GEMM or norm reads. An untied word embedding (and the
  // learned positions) is only gathered: the lookup reads the fp32 main parameters and no copy is kept. The
  // buffer order is Megatron's (reversed): the embedding tables are the last elements, so the copy is the
  // buffer's first model_copy_elements_.
  model_copy_elements_ = total;
  if (compute_dtype_ != DType::kFP32 && !config_.tied_embeddings) {
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
  const ParameterEntry& head = head_entry();
  for (const ParameterEntry& e : layout_.entries()) {
    const bool linear = e.name.ends_with("linear_qkv.weight") || e.name.ends_with("linear_proj.weight") ||
                        e.name.ends_with("linear_fc1.weight") || e.name.ends_with("linear_fc2.weight");
    if (&e == &head || linear) gemm_weights.emplace_back(e.offset, e.offset + e.numel());
  }
  std::sort(gemm_weights.begin(), gemm_weights.end());
  std::int64_t next = 0;
  gemm_weights.emplace_back(total, total);
  for (const auto& [begin, end] : gemm_weights) {
    if (begin > next) zeroed_grads_.push_back(carve(grads_, next, 1, begin - next, 4));
    next = std::max(next, end);
  }
  layer_grads_written_.assign(config_.num_layers, false);
  if (grads_.data != nullptr) backend_.fill_zero(grads_);  // once: the GEMM weights' ranges too

  for (int l = 0; l <= config_.num_layers; ++l)
    residual_.push_back(backend_.allocate(compute_dtype_, T, h, "residual stream (layer inputs)"));
  // Buffers shared by every layer. mlp_scratch_ holds, in turn: the activation output (forward), in backward
  // fc2's data gradient and then the recomputed activation output, then the attention output gradient and
  // the qkv gradient side by side.
  const std::int64_t ffn = config_.ffn_per_rank(), attn_w = config_.attention_width(),
                     qkv_w = config_.qkv_width(), storage = backend_.storage_bytes(compute_dtype_);
  norm1_out_ = backend_.allocate(compute_dtype_, T, h, "norm outputs (shared, recomputed)");
  norm2_out_ = backend_.allocate(compute_dtype_, T, h, "norm outputs (shared, recomputed)");
  mlp_scratch_ = backend_.allocate(compute_dtype_, 1, T * std::max(ffn, attn_w + qkv_w),
                                   "activation output / gradient scratch (shared)");
  const int saved_sets = recompute_ == RecomputeGranularity::kFull ? 1 : config_.num_layers;
  const bool keep_attention = recompute_ == RecomputeGranularity::kNone;
  for (int l = 0; l < saved_sets; ++l) saved_.push_back(allocate_layer_activations(keep_attention));
  if (!keep_attention) {
    shared_attn_ = backend_.allocate(compute_dtype_, T, attn_w, "recomputed attention (shared)");
    shared_lse_ = backend_.allocate(DType::kFP32, batch_.micro_batch * config_.heads_per_rank(), batch_.seq,
                                    "recomputed attention (shared)");
    for (LayerActivations& acts : saved_) {
      acts.attn = shared_attn_;
      acts.lse = shared_lse_;
    }
  }
  final_norm_ = backend_.allocate(compute_dtype_, T, h, "final norm");
  final_mean_ = backend_.allocate(DType::kFP32, T, 1, "final norm");
  final_rstd_ = backend_.allocate(DType::kFP32, T, 1, "final norm");
  loss_chunk_rows_ = layouts::loss_chunk_rows(T, config_.vocab_per_rank(), batch_.loss_chunk_logits_bytes);
  logits_ = backend_.allocate(compute_dtype_, loss_chunk_rows_, config_.vocab_per_rank(),
                              "logits (and their gradient), one token chunk");
  tokens_ = backend_.allocate_int32(T, 1, "tokens, targets, losses");
  targets_ = backend_.allocate_int32(T, 1, "tokens, targets, losses");
  losses_ = backend_.allocate(DType::kFP32, batch_.num_microbatches, T, "tokens, targets, losses");
  d_res_ = backend_.allocate(compute_dtype_, T, h, "backward scratch (T, h)");
  d_mid_ = backend_.allocate(compute_dtype_, T, h, "backward scratch (T, h)");
  d_hidden_ = backend_.allocate(compute_dtype_, T, h, "backward scratch (T, h)");
  fc2_out_ = d_hidden_;  // forward only; d_hidden_ is dead between layers' backwards
  d_attn_ = carve(mlp_scratch_, 0, T, attn_w, storage);
  d_qkv_ = carve(mlp_scratch_, T * attn_w, T, qkv_w, storage);
  counted_tokens_.assign(batch_.num_microbatches, 0.0);

  Backend::ScratchNeeds needs;
  needs.tokens = T;
  needs.hidden = h;
  needs.max_bias_cols = std::max({h, config_.qkv_width(), config_.fc1_width()});
  needs.vocab = config_.vocab_per_rank();
  needs.attention = attention_args(saved_[0]);
  const std::int64_t scratch_bytes = backend_.scratch_bytes(needs);
  if (scratch_bytes > 0)
    backend_.set_scratch(backend_.allocate(DType::kFP32, 1, (scratch_bytes + 3) / 4, "kernel scratch"));
}

GPTModel::LayerActivations GPTModel::allocate_layer_activations(bool with_attention) {
  const std::int64_t T = batch_.tokens(), h = config_.hidden;
  LayerActivations a;
  a.ln1 = norm1_out_;
  a.ln1_mean = backend_.allocate(DType::kFP32, T, 1, "saved: norm statistics");
  a.ln1_rstd = backend_.allocate(DType::kFP32, T, 1, "saved: norm statistics");
  a.qkv = backend_.allocate(compute_dtype_, T, config_.qkv_width(), "saved: qkv");
  if (with_attention) {
    a.attn = backend_.allocate(compute_dtype_, T, config_.attention_width(), "saved: attention output");
    a.lse = backend_.allocate(DType::kFP32, batch_.micro_batch * config_.heads_per_rank(), batch_.seq,
                              "saved: attention output");
  }
  a.mid = backend_.allocate(compute_dtype_, T, h, "saved: mid residual");
  a.ln2 = norm2_out_;
  a.ln2_mean = backend_.allocate(DType::kFP32, T, 1, "saved: norm statistics");
  a.ln2_rstd = backend_.allocate(DType::kFP32, T, 1, "saved: norm statistics");
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

GPTModel::LayerWeights GPTModel::layer_weights(Tensor buffer, int l) const {
  auto get = [&](const char* suffix) -> Tensor {
    const std::string name = layer_parameter(l, suffix);
    for (const ParameterEntry& e : layout_.entries())
      if (e.name == name) return view(buffer, e);
    return Tensor{};
  };
  LayerWeights w;
  w.norm1_w = get("input_layernorm.weight");
  w.norm1_b = get("input_layernorm.bias");
  w.qkv_w = get("self_attention.linear_qkv.weight");
  w.qkv_b = get("self_attention.linear_qkv.bias");
  w.proj_w = get("self_attention.linear_proj.weight");
  w.proj_b = get("self_attention.linear_proj.bias");
  w.norm2_w = get("pre_mlp_layernorm.weight");
  w.norm2_b = get("pre_mlp_layernorm.bias");
  w.fc1_w = get("mlp.linear_fc1.weight");
  w.fc1_b = get("mlp.linear_fc1.bias");
  w.fc2_w = get("mlp.linear_fc2.weight");
  w.fc2_b = get("mlp.linear_fc2.bias");
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
      const float std = e.init == ParameterInit::kNormal ? config_.init_std : scaled_std;
      std::mt19937_64 rng(splitmix64(seed * 0x100000001B3ull + i));
      std::normal_distribution<float> normal(0.0f, std);
      for (std::int64_t j = 0; j < e.numel(); ++j) out[j] = normal(rng);
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
  layer_grads_written_.assign(config_.num_layers, false);
  head_grad_written_ = false;
}

void GPTModel::tensor_parallel_reduce(Tensor t) {
  // Megatron's reduce in a row-parallel layer's forward / a column-parallel layer's input-gradient; a
  // no-op at TP size 1.
  if (communicator_.size(CommGroup::kTensor) > 1)
    communicator_.all_reduce(CommGroup::kTensor, t, ReduceOp::kSum, {"tp_all_reduce", -1, OpPhase::kForward});
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
  AttentionArgs a;
  a.qkv = acts.qkv;
  a.out = acts.attn;
  a.lse = acts.lse;
  a.batch = batch_.micro_batch;
  a.seq = batch_.seq;
  a.heads = config_.heads_per_rank();
  a.kv_heads = config_.kv_heads_per_rank();
  a.head_dim = config_.head_dim;
  a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
  return a;
}

GPTModel::LayerActivations& GPTModel::activations_for(int layer) {
  return recompute_ == RecomputeGranularity::kFull ? saved_[0] : saved_[layer];
}

void GPTModel::layer_forward(int l, LayerActivations& a, Tensor input, Tensor output, OpPhase phase) {
  const LayerWeights w = layer_weights(model_params_, l);
  const std::int64_t T = batch_.tokens();
  auto gemm_linear = [&](Tensor x, Tensor weight, Tensor bias, Tensor y, const char* label) {
    backend_.gemm(linear_forward_args(x, weight, y, bias, T), {label, l, phase});
  };
  backend_.norm_forward(norm_args(input, {}, {}, w.norm1_w, w.norm1_b, a.ln1, a.ln1_mean, a.ln1_rstd),
                        {"input_norm", l, phase});
  gemm_linear(a.ln1, w.qkv_w, w.qkv_b, a.qkv, "qkv");
  if (config_.position == PositionEmbedding::kRope)
    backend_.rope(a.qkv, batch_.seq, config_.heads_per_rank(), config_.kv_heads_per_rank(), config_.head_dim,
                  config_.rope_theta, false, {"rope", l, phase});
  backend_.attention_forward(attention_args(a), {"attn", l, phase});
  gemm_linear(a.attn, w.proj_w, w.proj_b, fc2_out_, "proj");
  tensor_parallel_reduce(fc2_out_);
  // The residual add fused into the pre-MLP norm: a.mid = bf16(proj output + input), a.ln2 = norm(a.mid).
  backend_.norm_forward(
      norm_args(fc2_out_, input, a.mid, w.norm2_w, w.norm2_b, a.ln2, a.ln2_mean, a.ln2_rstd),
      {"pre_mlp_norm", l, phase});
  if (config_.activation == ActivationKind::kGelu) {
    // fc1 with bias and GELU fused in the GEMM's epilogue; a.fc1 keeps the pre-activation for the backward.
    backend_.linear_gelu_forward(linear_forward_args(a.ln2, w.fc1_w, a.fc1, w.fc1_b, T), a.act,
                                 {"fc1", l, phase});
  } else {
    gemm_linear(a.ln2, w.fc1_w, w.fc1_b, a.fc1, "fc1");
    backend_.activation_forward(config_.activation, a.fc1, a.act, {"act", l, phase});
  }
  gemm_linear(a.act, w.fc2_w, w.fc2_b, fc2_out_, "fc2");
  tensor_parallel_reduce(fc2_out_);
  backend_.add(a.mid, fc2_out_, output, {"residual2", l, phase});
}

void GPTModel::layer_backward(int l, LayerActivations& a, Tensor input) {
  const LayerWeights w = layer_weights(model_params_, l);
  const LayerWeights g = layer_weights(grads_, l);
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
  const bool accumulate = layer_grads_written_[l];
  layer_grads_written_[l] = true;
  auto wgrad = [&](Tensor dy, Tensor x, Tensor weight, Tensor d_weight, Tensor d_bias, const char* label) {
    GemmArgs args = linear_weight_grad_args(dy, x, weight, d_weight, d_bias, T);
    args.accumulate = accumulate;
    backend_.gemm(args, {label, l, kB});
  };
  // MLP. d_res_ holds the gradient of the layer output. fc2's data gradient goes to the shared activation
  // buffer; one pass then turns it into fc1's output gradient (in place over the saved fc1 output, which
  // nothing reads afterwards) and recomputes the activation output (in place over the data gradient) for
  // fc2's weight gradient.
  dgrad(d_res_, w.fc2_w, a.act, "fc2_dgrad");
  backend_.activation_backward_recompute(config_.activation, a.fc1, a.act, a.fc1, a.act, {"act", l, kB});
  wgrad(d_res_, a.act, w.fc2_w, g.fc2_w, g.fc2_b, "fc2_wgrad");
  const Tensor d_fc1 = a.fc1;
  if (recompute_shared)
    backend_.norm_forward(
        with_stats(norm_args(a.mid, {}, {}, w.norm2_w, w.norm2_b, a.ln2, a.ln2_mean, a.ln2_rstd)),
        {"pre_mlp_norm", l, kR});
  dgrad(d_fc1, w.fc1_w, d_hidden_, "fc1_dgrad");
  wgrad(d_fc1, a.ln2, w.fc1_w, g.fc1_w, g.fc1_b, "fc1_wgrad");
  tensor_parallel_reduce(d_hidden_);
  backend_.norm_backward(norm_args(a.mid, {}, {}, w.norm2_w, w.norm2_b, a.ln2, a.ln2_mean, a.ln2_rstd),
                         d_hidden_, d_res_, d_mid_, g.norm2_w, g.norm2_b, {"pre_mlp_norm", l, kB});
  // Attention.
  if (recompute_ == RecomputeGranularity::kSelective)
    backend_.attention_forward(attention_args(a), {"attn", l, kR});
  dgrad(d_mid_, w.proj_w, d_attn_, "proj_dgrad");
  wgrad(d_mid_, a.attn, w.proj_w, g.proj_w, g.proj_b, "proj_wgrad");
  backend_.attention_backward(attention_args(a), d_attn_, d_qkv_, {"attn", l, kB});
  if (config_.position == PositionEmbedding::kRope)
    backend_.rope(d_qkv_, batch_.seq, config_.heads_per_rank(), config_.kv_heads_per_rank(), config_.head_dim,
                  config_.rope_theta, true, {"rope", l, kB});
  if (recompute_shared)
    backend_.norm_forward(
        with_stats(norm_args(input, {}, {}, w.norm1_w, w.norm1_b, a.ln1, a.ln1_mean, a.ln1_rstd)),
        {"input_norm", l, kR});
  dgrad(d_qkv_, w.qkv_w, d_hidden_, "qkv_dgrad");
  wgrad(d_qkv_, a.ln1, w.qkv_w, g.qkv_w, g.qkv_b, "qkv_wgrad");
  tensor_parallel_reduce(d_hidden_);
  backend_.norm_backward(norm_args(input, {}, {}, w.norm1_w, w.norm1_b, a.ln1, a.ln1_mean, a.ln1_rstd),
                         d_hidden_, d_mid_, d_res_, g.norm1_w, g.norm1_b, {"input_norm", l, kB});
}

void GPTModel::forward(const MicroBatch& mb, int index) { run_forward(mb, index, true); }

void GPTModel::run_forward(const MicroBatch& mb, int index, bool with_gradients) {
  const std::int64_t T = batch_.tokens();
  if (index < 0 || index >= batch_.num_microbatches)
    throw std::out_of_range("micro-batch index out of range");
  if (pending_backward_ >= 0) throw std::logic_error("forward of a micro-batch before the previous backward");
  if (static_cast<std::int64_t>(mb.tokens.size()) != T || static_cast<std::int64_t>(mb.labels.size()) != T ||
      static_cast<std::int64_t>(mb.loss_mask.size()) != T)
    throw std::invalid_argument("micro-batch size does not match micro_batch * seq");
  std::vector<std::int32_t> targets(T);
  double counted = 0.0;
  for (std::int64_t t = 0; t < T; ++t) {
    const bool counts = mb.loss_mask[t] != 0.0f;
    targets[t] = counts ? mb.labels[t] : -1;
    counted += counts ? 1.0 : 0.0;
  }
  counted_tokens_[index] = counted;
  backend_.upload_int32(tokens_, mb.tokens.data());
  backend_.upload_int32(targets_, targets.data());

  const ParameterEntry& word = layout_.find("embedding.word_embeddings.weight");
  Tensor position;
  if (config_.position == PositionEmbedding::kLearned)
    position = view(model_params_, layout_.find("embedding.position_embeddings.weight"));
  backend_.embedding_forward(tokens_, view(model_params_, word), position, batch_.seq, residual_[0],
                             {"embedding", -1, kF});
  tensor_parallel_reduce(residual_[0]);  // vocab-parallel embedding
  for (int l = 0; l < config_.num_layers; ++l)
    layer_forward(l, activations_for(l), residual_[l], residual_[l + 1], kF);

  const Tensor fn_w = view(model_params_, layout_.find("decoder.final_layernorm.weight"));
  Tensor fn_b;
  if (config_.norm == NormKind::kLayerNorm)
    fn_b = view(model_params_, layout_.find("decoder.final_layernorm.bias"));
  backend_.norm_forward(
      norm_args(residual_[config_.num_layers], {}, {}, fn_w, fn_b, final_norm_, final_mean_, final_rstd_),
      {"final_norm", -1, kF});
  // LM head and loss per token chunk (layouts::loss_chunk_rows): logits, cross entropy (losses, and the
  // logits' gradient in place), then the head's data gradient (into d_hidden_, read by the backward's final
  // norm) and weight gradient, so one chunk of logits is held at a time.
  const ParameterEntry& out_entry = head_entry();
  const Tensor out_w = view(model_params_, out_entry);
  // Mean over the counted tokens of the micro-batch, averaged over the iteration's micro-batches.
  const float grad_scale = counted > 0 ? static_cast<float>(1.0 / (counted * batch_.num_microbatches)) : 0.0f;
  const std::int64_t storage = backend_.storage_bytes(compute_dtype_);
  for (std::int64_t first = 0; first < T; first += loss_chunk_rows_) {
    const std::int64_t rows = std::min(loss_chunk_rows_, T - first);
    const Tensor logits = carve(logits_, 0, rows, logits_.cols, storage);
    const Tensor hidden = rows_of(final_norm_, first, rows, storage);
    backend_.gemm(linear_forward_args(hidden, out_w, logits, {}, rows), {"logits", -1, kF});
    Tensor losses = rows_of(losses_, index, 1, 4);
    losses.data = losses.data == nullptr ? nullptr : static_cast<float*>(losses.data) + first;
    losses.cols = rows;
    backend_.cross_entropy(logits, rows_of(targets_, first, rows, 4), losses, grad_scale,
                           {"cross_entropy", -1, kF});
    if (!with_gradients) continue;
    backend_.gemm(linear_data_grad_args(logits, out_w, rows_of(d_hidden_, first, rows, storage), rows),
                  {"logits_dgrad", -1, kB});
    GemmArgs head_wgrad = linear_weight_grad_args(logits, hidden, out_w, view(grads_, out_entry), {}, rows);
    head_wgrad.accumulate = head_grad_written_;
    head_grad_written_ = true;
    backend_.gemm(head_wgrad, {"logits_wgrad", -1, kB});
  }
  if (with_gradients) pending_backward_ = index;
}

void GPTModel::backward(int index) {
  if (pending_backward_ != index)
    throw std::logic_error("backward of a micro-batch whose forward did not run last");
  pending_backward_ = -1;
  // d_hidden_ holds the gradient of the final norm's output (the LM head's data gradient, from forward()).
  tensor_parallel_reduce(d_hidden_);
  Tensor fn_b, d_fn_b;
  if (config_.norm == NormKind::kLayerNorm) {
    fn_b = view(model_params_, layout_.find("decoder.final_layernorm.bias"));
    d_fn_b = view(grads_, layout_.find("decoder.final_layernorm.bias"));
  }
  const ParameterEntry& fn_w = layout_.find("decoder.final_layernorm.weight");
  backend_.norm_backward(norm_args(residual_[config_.num_layers], {}, {}, view(model_params_, fn_w), fn_b,
                                   final_norm_, final_mean_, final_rstd_),
                         d_hidden_, {}, d_res_, view(grads_, fn_w), d_fn_b, {"final_norm", -1, kB});
  for (int l = config_.num_layers - 1; l >= 0; --l) {
    LayerActivations& acts = activations_for(l);
    if (recompute_ == RecomputeGranularity::kFull)
      layer_forward(l, acts, residual_[l], residual_[l + 1],
                    OpPhase::kRecompute);  // as Megatron: the whole layer
    layer_backward(l, acts, residual_[l]);
  }
  Tensor d_position;
  if (config_.position == PositionEmbedding::kLearned)
    d_position = view(grads_, layout_.find("embedding.position_embeddings.weight"));
  backend_.embedding_backward(tokens_, d_res_, batch_.seq,
                              view(grads_, layout_.find("embedding.word_embeddings.weight")), d_position,
                              {"embedding", -1, kB});
}

std::vector<double> GPTModel::microbatch_losses() {
  std::vector<float> host(losses_.numel());
  backend_.download(losses_, host.data());
  std::vector<double> out(batch_.num_microbatches, 0.0);
  const std::int64_t T = batch_.tokens();
  for (int i = 0; i < batch_.num_microbatches; ++i) {
    double sum = 0.0;
    for (std::int64_t t = 0; t < T; ++t) sum += host[i * T + t];
    out[i] = counted_tokens_[i] > 0 ? sum / counted_tokens_[i] : 0.0;
  }
  return out;
}

double GPTModel::evaluate(const MicroBatch& mb) {
  run_forward(mb, 0, false);
  return microbatch_losses()[0];
}

}  // namespace megatune::executor
