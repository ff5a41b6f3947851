// TransformerConfig validation and a one-line description.
#include "executor/model/transformer_config.h"

#include <sstream>

#include "base/user_error.h"
#include "layouts/model_spec.h"

namespace megatune::executor {

void TransformerConfig::validate() const {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw UserError(message);
  };
  require(num_layers >= 1, "--num-layers must be >= 1");
  require(hidden >= 1 && heads >= 1 && head_dim >= 1,
          "--hidden-size, --num-attention-heads and --kv-channels must be >= 1");
  require(kv_heads >= 1 && heads % kv_heads == 0,
          "--num-query-groups must divide --num-attention-heads (got " + std::to_string(kv_heads) + " for " +
              std::to_string(heads) + " heads)");
  require(ffn_hidden >= 1, "--ffn-hidden-size must be >= 1");
  require(vocab_size >= 2, "vocabulary size must be >= 2");
  require(tensor_parallel_size >= 1 && heads % tensor_parallel_size == 0 &&
              kv_heads % tensor_parallel_size == 0 && ffn_hidden % tensor_parallel_size == 0 &&
              vocab_size % tensor_parallel_size == 0,
          "--tensor-model-parallel-size must divide heads, query groups, FFN size and padded vocabulary");
  require(position != PositionEmbedding::kRope || mla || head_dim % 2 == 0,
          "RoPE needs an even head dimension (--kv-channels)");
  require(!qk_layernorm || !mla,
          "--qk-layernorm under multi-latent attention is the latent norms MLA always has, not head norms");
  require(max_seq >= 1, "--seq-length must be >= 1");
  require(mtp_num_layers >= 0, "--mtp-num-layers must be >= 0");
  require(mtp_num_layers == 0 || hidden % tensor_parallel_size == 0,
          "--mtp-num-layers: --tensor-model-parallel-size must divide --hidden-size (eh_proj is "
          "column-parallel)");
  if (mla) {
    require(kv_lora_rank >= 1 && qk_head_dim >= 1 && qk_pos_emb_head_dim >= 1 && v_head_dim >= 1 &&
                q_lora_rank >= 0,
            "--multi-latent-attention needs --kv-lora-rank, --qk-head-dim, --qk-pos-emb-head-dim and "
            "--v-head-dim >= 1");
    require(
        head_dim == qk_head_dim + qk_pos_emb_head_dim && kv_heads == heads,
        "multi-latent attention: head_dim must be qk_head_dim + qk_pos_emb_head_dim, one kv head per head");
    require(
        position == PositionEmbedding::kRope && qk_pos_emb_head_dim % 2 == 0,
        "--multi-latent-attention needs --position-embedding-type rope and an even --qk-pos-emb-head-dim");
  }
  if (!is_moe()) return;
  require(moe_ffn_hidden >= 1, "--moe-ffn-hidden-size must be >= 1");
  require(static_cast<int>(moe_layers.size()) == num_layers,
          "--moe-layer-freq must give one entry per layer (" + std::to_string(num_layers) + ")");
  require(expert_parallel_size >= 1 && num_experts % expert_parallel_size == 0,
          "--expert-model-parallel-size must divide --num-experts (" + std::to_string(num_experts) + ")");
  require(expert_tensor_parallel_size >= 1 && moe_ffn_hidden % expert_tensor_parallel_size == 0,
          "--expert-tensor-parallel-size must divide --moe-ffn-hidden-size (" +
              std::to_string(moe_ffn_hidden) + ")");
  require(shared_expert_ffn % tensor_parallel_size == 0,
          "--tensor-model-parallel-size must divide --moe-shared-expert-intermediate-size");
  router.validate(num_experts);
}

std::string TransformerConfig::describe() const {
  std::ostringstream out;
  out << num_layers << "L h" << hidden << " heads " << heads << "/" << kv_heads << " d" << head_dim << " ffn "
      << ffn_hidden << " vocab " << vocab_size << (norm == NormKind::kRMSNorm ? " RMSNorm" : " LayerNorm")
      << (activation == ActivationKind::kSwiglu ? " SwiGLU" : " GELU")
      << (position == PositionEmbedding::kRope ? " RoPE" : " learned-pos")
      << (tied_embeddings ? " tied" : " untied") << (bias ? " bias" : " no-bias");
  if (qk_layernorm) out << " qk-norm";
  if (mla)
    out << " MLA q_lora " << q_lora_rank << " kv_lora " << kv_lora_rank << " qk " << qk_head_dim << "+"
        << qk_pos_emb_head_dim << " v " << v_head_dim;
  if (mla && yarn.scaled())
    out << " YaRN x" << yarn.factor << " mscale " << yarn.mscale << "/" << yarn.mscale_all_dim;
  if (mtp_num_layers > 0) out << " MTP " << mtp_num_layers << " x" << mtp_loss_scaling_factor;
  if (is_moe())
    out << " MoE " << num_experts << " experts top-" << router.topk << " ffn " << moe_ffn_hidden
        << (shared_expert_ffn > 0 ? " shared " + std::to_string(shared_expert_ffn) : "");
  return out.str();
}

}  // namespace megatune::executor

namespace megatune::executor {

layouts::RankShape rank_shape(const TransformerConfig& c, std::int64_t micro_batch, std::int64_t seq,
                              int cp) {
  layouts::RankShape s;
  s.num_layers = c.num_layers;
  s.hidden = c.hidden;
  s.heads = c.heads;
  s.groups = c.kv_heads;
  s.head_dim = c.head_dim;
  s.head_dim_v = c.mla ? c.v_head_dim : c.head_dim;
  s.ffn = c.ffn_hidden;
  s.vocab_padded = c.vocab_size;
  s.max_positions = c.max_seq;
  s.rms = c.norm == NormKind::kRMSNorm;
  s.swiglu = c.activation == ActivationKind::kSwiglu;
  s.rope = c.position == PositionEmbedding::kRope;
  s.tied = c.tied_embeddings;
  s.bias = c.bias;
  s.tp = c.tensor_parallel_size;
  s.sp = c.sequence_parallel;
  s.mla = c.mla;
  s.qk_norm = c.qk_layernorm;
  s.q_lora_rank = c.q_lora_rank;
  s.kv_lora_rank = c.kv_lora_rank;
  s.qk_head_dim = c.qk_head_dim;
  s.qk_pos_emb_head_dim = c.qk_pos_emb_head_dim;
  s.v_head_dim = c.v_head_dim;
  s.moe_layers = c.moe_layers;
  s.experts = c.num_experts;
  s.moe_ffn = c.moe_ffn_hidden;
  s.shared_ffn = c.shared_expert_ffn;
  s.topk = c.is_moe() ? c.router.topk : 0;
  s.ep = c.expert_parallel_size;
  s.ep_rank = c.expert_parallel_rank;
  s.etp = c.expert_tensor_parallel_size;
  s.mtp_num_layers = c.mtp_num_layers;
  s.cp = cp;
  if (micro_batch > 0) layouts::resolve_tokens(s, seq, micro_batch);
  return s;
}

TransformerConfig transformer_config_from(const layouts::ModelSpec& spec, int tp, float rope_theta,
                                          float norm_eps, float init_std) {
  if (spec.is_moe() && spec.add_bias_linear)
    throw UserError("--num-experts: the executor's experts have no biases; add --disable-bias-linear");
  TransformerConfig c;
  c.num_layers = spec.num_layers;
  c.hidden = spec.hidden_size;
  c.heads = spec.num_attention_heads;
  c.kv_heads = spec.query_groups();
  c.head_dim = spec.head_dim();
  c.ffn_hidden = spec.ffn_size();
  c.vocab_size = spec.padded_vocab_size(tp) / tp * tp;
  c.max_seq = spec.max_positions();
  c.norm = spec.normalization == layouts::Normalization::kRMSNorm ? NormKind::kRMSNorm : NormKind::kLayerNorm;
  c.activation =
      spec.activation == layouts::Activation::kSwiglu ? ActivationKind::kSwiglu : ActivationKind::kGelu;
  c.position = spec.position_embedding == layouts::PositionEmbedding::kRope ? PositionEmbedding::kRope
                                                                            : PositionEmbedding::kLearned;
  c.rope_theta = rope_theta;
  c.tied_embeddings = !spec.untie_embeddings_and_output_weights;
  c.bias = spec.add_bias_linear;
  c.qk_layernorm = spec.qk_layernorm && !spec.multi_latent_attention;
  c.norm_eps = norm_eps;
  c.init_std = init_std;
  c.tensor_parallel_size = tp;
  c.mtp_num_layers = spec.mtp_num_layers;
  if (spec.multi_latent_attention) {
    c.mla = true;
    c.kv_heads = c.heads;
    c.q_lora_rank = spec.q_lora_rank;
    c.kv_lora_rank = spec.kv_lora_rank;
    c.qk_head_dim = spec.qk_head_dim;
    c.qk_pos_emb_head_dim = spec.qk_pos_emb_head_dim;
    c.v_head_dim = spec.v_head_dim;
    c.yarn.factor = spec.rotary_scaling_factor;
    c.yarn.mscale = spec.mscale;
    c.yarn.mscale_all_dim = spec.mscale_all_dim;
    c.head_dim = spec.qk_head_dim + spec.qk_pos_emb_head_dim;
  }
  if (spec.is_moe()) {
    c.num_experts = spec.num_experts;
    c.moe_ffn_hidden = spec.moe_ffn_size();
    c.shared_expert_ffn = spec.moe_shared_expert_intermediate_size;
    c.router.num_experts = spec.num_experts;
    c.router.topk = spec.moe_router_topk;
    for (int l = 0; l < spec.num_layers; ++l) c.moe_layers.push_back(spec.is_moe_layer(l) ? 1 : 0);
  }
  c.validate();
  return c;
}

}  // namespace megatune::executor
