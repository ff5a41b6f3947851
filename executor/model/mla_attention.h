// MlaAttention: Megatron's multi-latent attention (DeepSeek-V2/V3) before and after the attention core, for
// one decoder layer on one tensor-parallel rank: the query (down-projection + latent norm + up-projection,
// or one projection), the kv down-projection giving the kv latent and the rotary key shared by all heads,
// the latent norm, the kv up-projection into per-head keys (non-rotary part) and values, decoupled RoPE on
// the rotary parts, and the backward of all of it. The attention core itself (queries and keys of
// qk_head_dim + qk_pos_emb_head_dim, values of v_head_dim) and the output projection stay with the layer.
//
// TP plan (layouts/parameter_table.h, Megatron's TE layer spec): the down-projections and latent norms are
// replicated and run on this rank's rows of the input norm output (its sequence shard under SP); the
// normalized latents and the rotary key are all-gathered over TP under SP (one collective); the
// up-projections are column-parallel over heads. In the backward the latents' gradients (partial over the
// heads of each rank) are reduce-scattered (SP) or all-reduced over TP in one collective; the replicated
// weights' gradients, computed on sequence shards under SP, join the SP norm all-reduce after the schedule.
#pragma once
#include <cstdint>

#include "executor/backend/backend.h"
#include "executor/model/transformer_config.h"
#include "executor/parallel/tensor_parallel.h"

namespace megatune::executor {

class MlaAttention {
 public:
  // A layer's latent norms (weights, or their fp32 gradients); null where the model has none (q without
  // --q-lora-rank, biases under RMSNorm).
  struct LatentNorms {
    Tensor q_w, q_b, kv_w, kv_b;
  };
  // A layer's MLA projections (the model's linears, with their weights and gradients; q_down null without
  // --q-lora-rank, q_up then the one query projection) and latent norms. Weight shapes on this TP rank,
  // H = heads / tp, d = qk_head_dim + qk_pos_emb_head_dim: q_down (r_q, h); q_up (H * d, r_q), or the one
  // projection (H * d, h), rows [q_nope of every head | q_pos_emb of every head]; kv_down (r_kv + d_rope, h);
  // kv_up (H * (qk_head_dim + v_head_dim), r_kv), rows [k_nope of every head | v of every head].
  struct Weights {
    const TensorParallelLinear *q_down = nullptr, *q_up = nullptr, *kv_down = nullptr, *kv_up = nullptr;
    LatentNorms norms, norm_grads;
  };
  // What one layer's backward reads (rows: this rank's rows of the residual stream, T = micro-batch tokens).
  struct Saved {
    Tensor q_latent;          // (rows, r_q) q down-projection output (the q norm's input)
    Tensor q_mean, q_rstd;    // (rows, 1) fp32
    Tensor kv_latent;         // (rows, r_kv) the kv latent (the kv norm's input)
    Tensor kv_mean, kv_rstd;  // (rows, 1) fp32
    Tensor latents;           // (T, r_q + r_kv + d_rope) [q latent normed | kv latent normed | rotary key]
    Tensor q, k;              // (T, H * d) per head [non-rotary | rotary], after RoPE: the attention's q, k
    Tensor kv;                // (T, H * (qk_head_dim + v_head_dim)) kv up-projection output; v is a view
  };

  // shape: the rank's (its local micro-batch; the residual stream's rows are its tokens_sp: T, or T / tp
  // under SP); buffers shared by all layers come from the backend arena (in sizing mode, only counted). tp:
  // the regions the latents are gathered and their gradients reduced over.
  MlaAttention(const TransformerConfig& config, const layouts::RankShape& shape, DType dtype,
               Backend& backend, const TensorParallelRegions& tp);

  Saved allocate_saved();
  // x: the input norm's output on this rank's rows (rows, h); x_full: (T, h), where the one query projection
  // (without --q-lora-rank) gathers x under SP.
  void forward(int layer, const Weights& w, Tensor x, Tensor x_full, Saved& s, layouts::OpPhase phase);
  // The attention core's arguments: queries / keys / values of `s`, output (T, H * v_head_dim) and lse.
  AttentionArgs attention_args(const Saved& s, Tensor out, Tensor lse) const;
  // From the attention output's gradient d_out: the attention core's backward, then every MLA weight's
  // gradient (overwritten unless accumulate) and the input norm output's gradient into d_x (rows, h). x,
  // x_full as in forward; d_x_full: (T, h) scratch for the one query projection's partial input gradient
  // (d_x itself without SP).
  void backward(int layer, const Weights& w, const Saved& s, Tensor out, Tensor lse, Tensor d_out, Tensor x,
                Tensor x_full, Tensor d_x, Tensor d_x_full, bool accumulate);

 private:
  void down_projections(int layer, const Weights& w, Tensor x, Saved& s, layouts::OpPhase phase);
  void up_projections(int layer, const Weights& w, Tensor q_input, Saved& s, layouts::OpPhase phase);
  void attention_grads_to_up_projections(int layer, const Saved& s, Tensor out, Tensor lse, Tensor d_out);
  void up_projection_grads(int layer, const Weights& w, const Saved& s, Tensor x_full, Tensor d_x_full,
                           bool accumulate);
  void down_projection_grads(int layer, const Weights& w, const Saved& s, Tensor x, Tensor d_x,
                             Tensor d_x_full, bool accumulate);
  NormArgs norm_args(Tensor x, Tensor gamma, Tensor beta, Tensor out, Tensor mean, Tensor rstd) const;
  Tensor cols(Tensor t, std::int64_t first, std::int64_t count) const;
  bool sp() const { return tp_.sequence_parallel(); }

  TransformerConfig config_;
  std::int64_t micro_batch_, seq_, rows_;
  DType dtype_;
  Backend& backend_;
  TensorParallelRegions tp_;
  std::int64_t heads_ = 0, q_rank_ = 0, kv_rank_ = 0, d_nope_ = 0, d_rope_ = 0, d_v_ = 0, latent_width_ = 0;
  RopeScaling rope_scaling_;  // YaRN on the rotary parts (config_.yarn; plain RoPE at factor 1)

  // Shared by all layers (forward and backward scratch).
  Tensor kv_compressed_;    // (rows, r_kv + d_rope) kv down-projection output
  Tensor latents_shard_;    // (rows, r_q + r_kv + d_rope) this rank's rows of Saved::latents (SP only)
  Tensor q_latent_norm_;    // (rows, r_q) q norm output (backward: its gradient)
  Tensor kv_latent_norm_;   // (rows, r_kv) kv norm output (backward: its gradient)
  Tensor q_rope_;           // (T, H * qk_head_dim + H * d_rope + d_rope) q up-projection | rotary key
  Tensor d_q_, d_k_;        // (T, H * d) attention gradients of q and k
  Tensor d_kv_;             // (T, H * (qk_head_dim + v_head_dim)) gradient of Saved::kv
  Tensor d_rope_key_;       // (T, d_rope) the rotary key's gradient summed over heads
  Tensor d_rope_key_head_;  // (T, d_rope) one head's share
  Tensor d_latents_;        // (T, latent_width) gradient of Saved::latents
  Tensor d_latents_shard_;  // (rows, latent_width) its reduced rows (SP; d_latents_ otherwise)
  Tensor d_kv_compressed_;  // (rows, r_kv + d_rope)
  Tensor d_q_latent_;       // (rows, r_q) the q norm's input gradient
  Tensor d_kv_latent_;      // (rows, r_kv) the kv norm's input gradient
};

}  // namespace megatune::executor
