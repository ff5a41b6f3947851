// The Megatron flags of a ModelSpec, as checkpoints record them.
#include "layouts/model_flags.h"

#include <sstream>
#include <string>

namespace megatune::layouts {
namespace {

// Shortest text that reads back to the same double.
std::string exact(double value) {
  for (int digits = 6;; ++digits) {
    std::ostringstream out;
    out.precision(digits);
    out << value;
    if (digits >= 17 || std::stod(out.str()) == value) return out.str();
  }
}

}  // namespace

std::vector<std::string> model_flags(const ModelSpec& m, const ModelNumerics& numerics) {
  std::vector<std::string> f;
  const auto add = [&](const char* flag, long long value) {
    f.insert(f.end(), {flag, std::to_string(value)});
  };
  add("--num-layers", m.num_layers);
  add("--hidden-size", m.hidden_size);
  add("--ffn-hidden-size", m.ffn_size());
  add("--num-attention-heads", m.num_attention_heads);
  if (m.num_query_groups > 0 && m.num_query_groups != m.num_attention_heads) {
    f.push_back("--group-query-attention");
    add("--num-query-groups", m.num_query_groups);
  }
  if (m.kv_channels > 0) add("--kv-channels", m.kv_channels);
  add("--seq-length", m.seq_length);
  add("--max-position-embeddings", m.max_positions());
  add("--vocab-size", m.vocab_size);
  add("--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by);
  f.insert(f.end(), {"--normalization", std::string(to_string(m.normalization))});
  if (m.activation == Activation::kSwiglu) f.push_back("--swiglu");
  f.insert(f.end(), {"--position-embedding-type", std::string(to_string(m.position_embedding))});
  if (m.untie_embeddings_and_output_weights) f.push_back("--untie-embeddings-and-output-weights");
  f.push_back(m.add_bias_linear ? "--add-bias-linear" : "--disable-bias-linear");
  if (m.qk_layernorm || m.multi_latent_attention) f.push_back("--qk-layernorm");
  if (m.multi_latent_attention) {
    f.push_back("--multi-latent-attention");
    add("--q-lora-rank", m.q_lora_rank);
    add("--kv-lora-rank", m.kv_lora_rank);
    add("--qk-head-dim", m.qk_head_dim);
    add("--qk-pos-emb-head-dim", m.qk_pos_emb_head_dim);
    add("--v-head-dim", m.v_head_dim);
    if (m.rotary_scaling_factor != 1.0)
      f.insert(f.end(), {"--rotary-scaling-factor", exact(m.rotary_scaling_factor), "--mscale",
                         exact(m.mscale), "--mscale-all-dim", exact(m.mscale_all_dim)});
  }
  if (m.is_moe()) {
    add("--num-experts", m.num_experts);
    add("--moe-router-topk", m.moe_router_topk);
    add("--moe-ffn-hidden-size", m.moe_ffn_size());
    if (m.moe_shared_expert_intermediate_size > 0)
      add("--moe-shared-expert-intermediate-size", m.moe_shared_expert_intermediate_size);
    std::string pattern = "[";
    for (int l = 0; l < m.num_layers; ++l)
      pattern += (l ? "," : "") + std::string(m.is_moe_layer(l) ? "1" : "0");
    f.insert(f.end(), {"--moe-layer-freq", pattern + "]"});
  }
  if (m.mtp_num_layers > 0) add("--mtp-num-layers", m.mtp_num_layers);
  f.insert(f.end(),
           {"--rotary-base", exact(numerics.rotary_base), "--norm-epsilon", exact(numerics.norm_epsilon)});
  return f;
}

std::string join_model_flags(const std::vector<std::string>& flags) {
  std::string line;
  for (const std::string& flag : flags) line += (line.empty() ? "" : " ") + flag;
  return line;
}

std::vector<std::string> split_model_flags(const std::string& line) {
  std::vector<std::string> flags;
  std::istringstream in(line);
  for (std::string word; in >> word;) flags.push_back(word);
  return flags;
}

}  // namespace megatune::layouts
