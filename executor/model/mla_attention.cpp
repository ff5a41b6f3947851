// MlaAttention: buffers, forward and backward of multi-latent attention's projections on one TP rank.
#include "executor/model/mla_attention.h"

#include <cmath>
#include <stdexcept>

namespace megatune::executor {
namespace {

using layouts::OpPhase;
constexpr OpPhase kMlaBackward = OpPhase::kBackward;

}  // namespace

MlaAttention::MlaAttention(const TransformerConfig& config, const layouts::RankShape& shape, DType dtype,
                           Backend& backend, const TensorParallelRegions& tp)
    : config_(config),
      micro_batch_(shape.micro_batch),
      seq_(shape.seq_local),
      rows_(shape.tokens_sp),
      dtype_(dtype),
      backend_(backend),
      tp_(tp) {
  if (!config_.mla) throw std::invalid_argument("MlaAttention: the model has no multi-latent attention");
  heads_ = shape.heads_per_rank();
  q_rank_ = config_.q_lora_rank;
  kv_rank_ = config_.kv_lora_rank;
  d_nope_ = config_.qk_head_dim;
  d_rope_ = config_.qk_pos_emb_head_dim;
  d_v_ = config_.v_head_dim;
  latent_width_ = q_rank_ + kv_rank_ + d_rope_;
  rope_scaling_ = yarn_rope_scaling(config_.yarn, d_rope_, config_.rope_theta);
  const std::int64_t T = micro_batch_ * seq_, d = d_nope_ + d_rope_;
  const char* shared = "MLA projections (shared)";
  auto alloc = [&](std::int64_t r, std::int64_t c) { return backend_.allocate(dtype_, r, c, shared); };
  kv_compressed_ = alloc(rows_, kv_rank_ + d_rope_);
  if (sp()) latents_shard_ = alloc(rows_, latent_width_);
  if (q_rank_ > 0) {
    q_latent_norm_ = alloc(rows_, q_rank_);
    d_q_latent_ = alloc(rows_, q_rank_);
  }
  kv_latent_norm_ = alloc(rows_, kv_rank_);
  d_kv_latent_ = alloc(rows_, kv_rank_);
  q_rope_ = alloc(T, heads_ * d + d_rope_);
  d_q_ = alloc(T, heads_ * d);
  d_k_ = alloc(T, heads_ * d);
  d_kv_ = alloc(T, heads_ * (d_nope_ + d_v_));
  d_rope_key_ = alloc(T, d_rope_);
  d_rope_key_head_ = alloc(T, d_rope_);
  d_latents_ = alloc(T, latent_width_);
  d_latents_shard_ = sp() ? alloc(rows_, latent_width_) : d_latents_;
  d_kv_compressed_ = alloc(rows_, kv_rank_ + d_rope_);
}

MlaAttention::Saved MlaAttention::allocate_saved() {
  const std::int64_t T = micro_batch_ * seq_, d = d_nope_ + d_rope_;
  const char* saved = "saved: MLA latents, q, k, v";
  const bool layernorm = config_.norm == NormKind::kLayerNorm;
  auto alloc = [&](std::int64_t r, std::int64_t c) { return backend_.allocate(dtype_, r, c, saved); };
  auto stats = [&]() { return backend_.allocate(DType::kFP32, rows_, 1, saved); };
  Saved s;
  if (q_rank_ > 0) {
    s.q_latent = alloc(rows_, q_rank_);
    if (layernorm) s.q_mean = stats();
    s.q_rstd = stats();
  }
  s.kv_latent = alloc(rows_, kv_rank_);
  if (layernorm) s.kv_mean = stats();
  s.kv_rstd = stats();
  s.latents = alloc(T, latent_width_);
  s.q = alloc(T, heads_ * d);
  s.k = alloc(T, heads_ * d);
  s.kv = alloc(T, heads_ * (d_nope_ + d_v_));
  return s;
}

Tensor MlaAttention::cols(Tensor t, std::int64_t first, std::int64_t count) const {
  return columns_of(t, first, count, backend_.storage_bytes(t.dtype));
}

NormArgs MlaAttention::norm_args(Tensor x, Tensor gamma, Tensor beta, Tensor out, Tensor mean,
                                 Tensor rstd) const {
  NormArgs a;
  a.kind = config_.norm;
  a.eps = config_.norm_eps;
  a.x = x;
  a.gamma = gamma;
  a.beta = beta;
  a.out = out;
  a.mean = mean;
  a.rstd = rstd;
  return a;
}

void MlaAttention::forward(int layer, const Weights& w, Tensor x, Tensor x_full, Saved& s, OpPhase phase) {
  const Tensor q_input = q_rank_ > 0 ? Tensor{} : w.q_up->gather_input(x, x_full, phase);
  down_projections(layer, w, x, s, phase);
  up_projections(layer, w, q_input, s, phase);
}

void MlaAttention::down_projections(int layer, const Weights& w, Tensor x, Saved& s, OpPhase phase) {
  // Replicated over TP, on this rank's rows: q latent (rows, r_q), [kv latent | rotary key] (rows, r_kv +
  // d_rope); the latents are normalized and packed with the rotary key, then gathered under SP.
  if (q_rank_ > 0) w.q_down->forward_gemm(x, s.q_latent, phase);
  w.kv_down->forward_gemm(x, kv_compressed_, phase);
  backend_.copy(cols(kv_compressed_, 0, kv_rank_), s.kv_latent);
  const Tensor packed = sp() ? latents_shard_ : s.latents;
  if (q_rank_ > 0) {
    backend_.norm_forward(norm_args(s.q_latent, w.norms.q_w, w.norms.q_b, q_latent_norm_, s.q_mean, s.q_rstd),
                          {"q_norm", layer, phase});
    backend_.copy(q_latent_norm_, cols(packed, 0, q_rank_));
  }
  backend_.norm_forward(
      norm_args(s.kv_latent, w.norms.kv_w, w.norms.kv_b, kv_latent_norm_, s.kv_mean, s.kv_rstd),
      {"kv_norm", layer, phase});
  backend_.copy(kv_latent_norm_, cols(packed, q_rank_, kv_rank_));
  backend_.copy(cols(kv_compressed_, kv_rank_, d_rope_), cols(packed, q_rank_ + kv_rank_, d_rope_));
  tp_.gather_sequence(latents_shard_, s.latents, "mla_latent_ag", layer, phase);
}

void MlaAttention::up_projections(int layer, const Weights& w, Tensor q_input, Saved& s, OpPhase phase) {
  // Column-parallel over heads, on all T tokens: q_rope_ = [q_nope (H * d_nope) | q_rope (H * d_rope) |
  // rotary key (d_rope)], so that one RoPE call rotates the queries' rotary parts and the shared key.
  const std::int64_t H = heads_, d = d_nope_ + d_rope_;
  const Tensor q_in = q_rank_ > 0 ? cols(s.latents, 0, q_rank_) : q_input;
  w.q_up->forward_gemm(q_in, cols(q_rope_, 0, H * d), phase);
  w.kv_up->forward_gemm(cols(s.latents, q_rank_, kv_rank_), s.kv, phase);
  backend_.copy(cols(s.latents, q_rank_ + kv_rank_, d_rope_), cols(q_rope_, H * d, d_rope_));
  backend_.rope(cols(q_rope_, H * d_nope_, H * d_rope_ + d_rope_), seq_, H, 1, d_rope_, config_.rope_theta,
                false, {"rope", layer, phase}, {}, rope_scaling_);
  for (std::int64_t i = 0; i < H; ++i) {  // per head: q = [q_nope | q_rope], k = [k_nope | rotary key]
    backend_.copy(cols(q_rope_, i * d_nope_, d_nope_), cols(s.q, i * d, d_nope_));
    backend_.copy(cols(q_rope_, H * d_nope_ + i * d_rope_, d_rope_), cols(s.q, i * d + d_nope_, d_rope_));
    backend_.copy(cols(s.kv, i * d_nope_, d_nope_), cols(s.k, i * d, d_nope_));
    backend_.copy(cols(q_rope_, H * d, d_rope_), cols(s.k, i * d + d_nope_, d_rope_));
  }
}

AttentionArgs MlaAttention::attention_args(const Saved& s, Tensor out, Tensor lse) const {
  const std::int64_t d = d_nope_ + d_rope_;
  AttentionArgs a;
  a.q = s.q;
  a.k = s.k;
  a.v = cols(s.kv, heads_ * d_nope_, heads_ * d_v_);
  a.out = out;
  a.lse = lse;
  a.batch = micro_batch_;
  a.seq_q = seq_;
  a.seq_kv = seq_;
  a.heads = heads_;
  a.kv_heads = heads_;
  a.head_dim = d;
  a.head_dim_v = d_v_;
  a.causal = true;
  // Megatron's: mscale^2 / sqrt(qk_head_dim + qk_pos_emb_head_dim), mscale = YaRN's _yarn_get_mscale(factor,
  // mscale_all_dim) (1 without scaling).
  const float mscale = static_cast<float>(yarn_attention_mscale(config_.yarn));
  a.softmax_scale = mscale * mscale / std::sqrt(static_cast<float>(d));
  return a;
}

void MlaAttention::backward(int layer, const Weights& w, const Saved& s, Tensor out, Tensor lse, Tensor d_out,
                            Tensor x, Tensor x_full, Tensor d_x, Tensor d_x_full, bool accumulate) {
  const Tensor q_input = q_rank_ > 0 ? Tensor{} : w.q_up->gather_input(x, x_full, kMlaBackward);
  attention_grads_to_up_projections(layer, s, out, lse, d_out);
  up_projection_grads(layer, w, s, q_input, d_x_full, accumulate);
  down_projection_grads(layer, w, s, x, d_x, d_x_full, accumulate);
}

void MlaAttention::attention_grads_to_up_projections(int layer, const Saved& s, Tensor out, Tensor lse,
                                                     Tensor d_out) {
  // The attention core's gradients, laid back out as q_rope_ (now its gradient): per-head q parts, the
  // rotary key's gradient summed over this rank's heads, then the inverse RoPE; the keys' non-rotary parts
  // into d_kv_, whose value part the attention backward writes directly.
  const std::int64_t H = heads_, d = d_nope_ + d_rope_;
  const AttentionArgs args = attention_args(s, out, lse);
  AttentionGrads grads;
  grads.d_out = d_out;
  grads.dq = d_q_;
  grads.dk = d_k_;
  grads.dv = cols(d_kv_, H * d_nope_, H * d_v_);
  backend_.attention_backward(args, grads, {"attn", layer, kMlaBackward});
  for (std::int64_t i = 0; i < H; ++i) {
    backend_.copy(cols(d_q_, i * d, d_nope_), cols(q_rope_, i * d_nope_, d_nope_));
    backend_.copy(cols(d_q_, i * d + d_nope_, d_rope_), cols(q_rope_, H * d_nope_ + i * d_rope_, d_rope_));
    backend_.copy(cols(d_k_, i * d, d_nope_), cols(d_kv_, i * d_nope_, d_nope_));
  }
  backend_.copy(cols(d_k_, d_nope_, d_rope_), d_rope_key_);
  for (std::int64_t i = 1; i < H; ++i) {
    backend_.copy(cols(d_k_, i * d + d_nope_, d_rope_), d_rope_key_head_);
    backend_.add(d_rope_key_, d_rope_key_head_, d_rope_key_, {"k_pos_emb_grad_sum", layer, kMlaBackward});
  }
  backend_.copy(d_rope_key_, cols(q_rope_, H * d, d_rope_));
  backend_.rope(cols(q_rope_, H * d_nope_, H * d_rope_ + d_rope_), seq_, H, 1, d_rope_, config_.rope_theta,
                true, {"rope", layer, kMlaBackward}, {}, rope_scaling_);
}

void MlaAttention::up_projection_grads(int layer, const Weights& w, const Saved& s, Tensor q_input,
                                       Tensor d_x_full, bool accumulate) {
  const std::int64_t H = heads_, d = d_nope_ + d_rope_;
  auto linear_grads = [&](const TensorParallelLinear& linear, Tensor dy, Tensor in, Tensor d_in) {
    linear.data_grad(dy, d_in);
    linear.weight_grad(dy, in, accumulate);
  };
  const Tensor d_q = cols(q_rope_, 0, H * d);
  if (q_rank_ > 0)
    linear_grads(*w.q_up, d_q, cols(s.latents, 0, q_rank_), cols(d_latents_, 0, q_rank_));
  else
    linear_grads(*w.q_up, d_q, q_input, d_x_full);
  linear_grads(*w.kv_up, d_kv_, cols(s.latents, q_rank_, kv_rank_), cols(d_latents_, q_rank_, kv_rank_));
  backend_.copy(cols(q_rope_, H * d, d_rope_), cols(d_latents_, q_rank_ + kv_rank_, d_rope_));
  // Each rank's latent gradients cover its heads only: summed over TP (reduce-scattered to the rows of the
  // replicated down-projections under SP).
  tp_.reduce(d_latents_, d_latents_shard_, "mla_latent_dgrad_ar", "mla_latent_dgrad_rs", layer, kMlaBackward);
}

void MlaAttention::down_projection_grads(int layer, const Weights& w, const Saved& s, Tensor x, Tensor d_x,
                                         Tensor d_x_full, bool accumulate) {
  const Tensor dl = d_latents_shard_;  // (rows, latent_width)
  const LatentNorms &n = w.norms, &dn = w.norm_grads;
  backend_.copy(cols(dl, q_rank_, kv_rank_), kv_latent_norm_);
  backend_.norm_backward(norm_args(s.kv_latent, n.kv_w, n.kv_b, kv_latent_norm_, s.kv_mean, s.kv_rstd),
                         kv_latent_norm_, {}, d_kv_latent_, dn.kv_w, dn.kv_b,
                         {"kv_norm", layer, kMlaBackward});
  backend_.copy(d_kv_latent_, cols(d_kv_compressed_, 0, kv_rank_));
  backend_.copy(cols(dl, q_rank_ + kv_rank_, d_rope_), cols(d_kv_compressed_, kv_rank_, d_rope_));
  if (q_rank_ > 0) {
    backend_.copy(cols(dl, 0, q_rank_), q_latent_norm_);
    backend_.norm_backward(norm_args(s.q_latent, n.q_w, n.q_b, q_latent_norm_, s.q_mean, s.q_rstd),
                           q_latent_norm_, {}, d_q_latent_, dn.q_w, dn.q_b, {"q_norm", layer, kMlaBackward});
  } else {
    // The one query projection is column-parallel: its input gradient is partial over TP.
    w.q_up->reduce_input_grad(d_x_full, d_x);
  }
  auto linear_grads = [&](const TensorParallelLinear& linear, Tensor dy, bool add_to_dx) {
    linear.data_grad(dy, d_x, add_to_dx);
    linear.weight_grad(dy, x, accumulate);
  };
  // Without --q-lora-rank d_x already holds the query projection's (reduced) input gradient.
  linear_grads(*w.kv_down, d_kv_compressed_, q_rank_ == 0);
  if (q_rank_ > 0) linear_grads(*w.q_down, d_q_latent_, true);
}

}  // namespace megatune::executor
