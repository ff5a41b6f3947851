// RankShape resolution from a (model, config) and the one attention shape of a rank.
#include "layouts/rank_shape.h"

#include <algorithm>

namespace megatune::layouts {
namespace {

constexpr std::int64_t kActivationBytes = 2;  // bf16

void resolve_model_dims(RankShape& s, const ModelSpec& model) {
  s.hidden = model.hidden_size;
  s.heads = model.num_attention_heads;
  s.groups = model.multi_latent_attention ? model.num_attention_heads : model.query_groups();
  s.head_dim =
      model.multi_latent_attention ? model.qk_head_dim + model.qk_pos_emb_head_dim : model.head_dim();
  s.head_dim_v = model.multi_latent_attention ? model.v_head_dim : s.head_dim;
  s.ffn = model.ffn_size();
  s.moe_ffn = model.is_moe() ? model.moe_ffn_size() : 0;
  s.shared_ffn = model.moe_shared_expert_intermediate_size;
  s.experts = model.num_experts;
  s.topk = model.is_moe() ? model.moe_router_topk : 0;
  s.max_positions = model.max_positions();
  s.swiglu = model.activation == Activation::kSwiglu;
  s.rms = model.normalization == Normalization::kRMSNorm;
  s.rope = model.position_embedding == PositionEmbedding::kRope;
  s.tied = !model.untie_embeddings_and_output_weights;
  s.bias = model.add_bias_linear;
  s.mla = model.multi_latent_attention;
  s.qk_norm = model.qk_layernorm && !model.multi_latent_attention;
  s.q_lora_rank = model.q_lora_rank;
  s.kv_lora_rank = model.kv_lora_rank;
  s.qk_head_dim = model.qk_head_dim;
  s.qk_pos_emb_head_dim = model.qk_pos_emb_head_dim;
  s.v_head_dim = model.v_head_dim;
  s.num_layers = model.num_layers;
  s.mtp_num_layers = model.mtp_num_layers;
  if (model.is_moe())
    for (int l = 0; l < model.num_layers; ++l) s.moe_layers.push_back(model.is_moe_layer(l) ? 1 : 0);
}

}  // namespace

AttentionShape RankShape::attention() const {
  AttentionShape a;
  a.batch = micro_batch;
  a.heads = heads_per_rank();
  a.kv_heads = std::max<std::int64_t>(1, groups_per_rank());
  a.seq_q = seq_local;
  a.seq_kv = seq;
  a.head_dim = head_dim;
  a.head_dim_v = head_dim_v;
  a.causal = true;
  return a;
}

void resolve_tokens(RankShape& s, std::int64_t seq, std::int64_t micro_batch) {
  s.seq = seq;
  s.seq_local = seq / s.cp;
  s.micro_batch = micro_batch;
  s.tokens = s.seq_local * s.micro_batch;
  s.tokens_sp = s.sp ? s.tokens / s.tp : s.tokens;
  s.p2p_bytes = s.tokens_sp * s.hidden * kActivationBytes;
}

RankShape resolve_rank_shape(const ModelSpec& model, const ParallelConfig& config, int ep_rank) {
  RankShape s;
  s.tp = config.tp();
  s.cp = config.cp();
  s.ep = config.ep();
  s.etp = config.etp();
  s.pp = config.pp();
  s.dp = config.dp();
  s.edp = config.edp();
  s.ep_rank = ep_rank;
  s.sp = config.sequence_parallel_enabled();
  s.moe_dispatcher = config.moe_token_dispatcher_type;
  resolve_model_dims(s, model);
  resolve_tokens(s, model.seq_length, config.micro_batch_size);
  s.vocab_padded = model.padded_vocab_size(s.tp);
  s.recompute = config.recompute_granularity;
  s.recompute_method = config.recompute_method;
  s.recompute_num_layers = config.recompute_num_layers;
  return s;
}

}  // namespace megatune::layouts
