// Multi-latent attention's projection ops (forward and backward of one layer) for the step program.
#include "layouts/mla_ops.h"

#include <string>

namespace megatune::layouts {
namespace {

constexpr std::int64_t kMlaAct = 2;  // bf16 activation bytes

struct MlaDims {
  std::int64_t heads = 0, q_rank = 0, kv_rank = 0, nope = 0, rope = 0, v = 0;
  std::int64_t qk() const { return nope + rope; }
  std::int64_t latent_width() const { return q_rank + kv_rank + rope; }  // [q latent | kv latent | key]
};

MlaDims dims(const ModelSpec& model, const RankShape& s) {
  MlaDims d;
  d.heads = s.heads_per_rank();
  d.q_rank = model.q_lora_rank;
  d.kv_rank = model.kv_lora_rank;
  d.nope = model.qk_head_dim;
  d.rope = model.qk_pos_emb_head_dim;
  d.v = model.v_head_dim;
  return d;
}

// The one RoPE call over the queries' rotary parts and the shared rotary key.
std::int64_t rope_bytes(const RankShape& s, const MlaDims& d) {
  return 2 * s.tokens * (d.heads + 1) * d.rope * kMlaAct;
}

}  // namespace

void mla_projections_forward(OpSink& o, const ModelSpec& model, const RankShape& s) {
  const MlaDims d = dims(model, s);
  const std::int64_t rows = s.tokens_sp;
  if (d.q_rank == 0 && s.sp)
    o.comm(OpKind::kAllGather, "qkv_input_ag", s.tokens * s.hidden * kMlaAct, CommGroup::kTensor, s.tp);
  if (d.q_rank > 0) o.gemm("q_down", rows, d.q_rank, s.hidden);
  o.gemm("kv_down", rows, d.kv_rank + d.rope, s.hidden);
  if (d.q_rank > 0) o.memory(OpKind::kNorm, "q_norm", 2 * rows * d.q_rank * kMlaAct);
  o.memory(OpKind::kNorm, "kv_norm", 2 * rows * d.kv_rank * kMlaAct);
  if (s.sp)
    o.comm(OpKind::kAllGather, "mla_latent_ag", s.tokens * d.latent_width() * kMlaAct, CommGroup::kTensor,
           s.tp);
  o.gemm("q_up", s.tokens, d.heads * d.qk(), d.q_rank > 0 ? d.q_rank : s.hidden);
  o.gemm("kv_up", s.tokens, d.heads * (d.nope + d.v), d.kv_rank);
  o.memory(OpKind::kRope, "rope", rope_bytes(s, d));
}

void mla_projections_backward(OpSink& o, const ModelSpec& model, const RankShape& s) {
  const MlaDims d = dims(model, s);
  const std::int64_t rows = s.tokens_sp;
  for (std::int64_t head = 1; head < d.heads; ++head)
    o.memory(OpKind::kElementwise, "k_pos_emb_grad_sum", 3 * s.tokens * d.rope * kMlaAct);
  o.memory(OpKind::kRopeBackward, "rope", rope_bytes(s, d));
  o.gemm_backward("q_up", s.tokens, d.heads * d.qk(), d.q_rank > 0 ? d.q_rank : s.hidden);
  o.gemm_backward("kv_up", s.tokens, d.heads * (d.nope + d.v), d.kv_rank);
  const std::int64_t latent_bytes = s.tokens * d.latent_width() * kMlaAct;
  if (s.sp)
    o.comm(OpKind::kReduceScatter, "mla_latent_dgrad_rs", latent_bytes, CommGroup::kTensor, s.tp);
  else
    o.comm(OpKind::kAllReduce, "mla_latent_dgrad_ar", latent_bytes, CommGroup::kTensor, s.tp);
  o.memory(OpKind::kNormBackward, "kv_norm", 3 * rows * d.kv_rank * kMlaAct);
  if (d.q_rank > 0) {
    o.memory(OpKind::kNormBackward, "q_norm", 3 * rows * d.q_rank * kMlaAct);
  } else if (s.sp) {
    o.comm(OpKind::kReduceScatter, "qkv_dgrad_rs", s.tokens * s.hidden * kMlaAct, CommGroup::kTensor, s.tp);
  } else {
    o.comm(OpKind::kAllReduce, "qkv_dgrad_ar", s.tokens * s.hidden * kMlaAct, CommGroup::kTensor, s.tp);
  }
  // Data gradients add up in the input norm output's gradient: the second GEMM accumulates.
  const auto down = [&](const std::string& label, std::int64_t out, bool add_to_dx) {
    o.gemm((label + "_dgrad").c_str(), rows, s.hidden, out, add_to_dx);
    o.gemm_backward(label, rows, out, s.hidden, /*need_dgrad=*/false);
  };
  down("kv_down", d.kv_rank + d.rope, d.q_rank == 0);
  if (d.q_rank > 0) down("q_down", d.q_rank, true);
}

}  // namespace megatune::layouts
