// ModelSpec: the shape of a GPT / Llama / Mixtral / DeepSeek-style decoder LM, its validation,
// parameter counts and the named presets.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace megatune::layouts {

enum class Normalization { kLayerNorm, kRMSNorm };
enum class Activation { kGelu, kSwiglu };
enum class PositionEmbedding { kLearnedAbsolute, kRope };

std::string_view to_string(Normalization normalization);           // "LayerNorm" | "RMSNorm"
std::string_view to_string(Activation activation);                 // "gelu" | "swiglu"
std::string_view to_string(PositionEmbedding position_embedding);  // "learned_absolute" | "rope"

// Parameter counts of a model, split by kind. Counts use the padded vocabulary of the TP size they were
// asked for (Megatron's embedding really holds the padded rows). Biases are included when add_bias_linear.
struct ParameterCounts {
  int64_t word_embedding = 0;            // V_padded * h
  int64_t position_embedding = 0;        // max_positions * h (learned positions only)
  int64_t output_layer = 0;              // V_padded * h when untied, else 0 (shares the word embedding)
  int64_t final_norm = 0;                // h or 2h
  int64_t attention_per_layer = 0;       // input norm + QKV (or MLA projections) + output projection
  int64_t dense_mlp_per_layer = 0;       // pre-MLP norm + fc1 + fc2 of a dense layer
  int64_t moe_mlp_per_layer = 0;         // pre-MLP norm + router + all routed experts + shared expert
  int64_t moe_mlp_active_per_layer = 0;  // pre-MLP norm + router + top-k routed experts + shared expert
  int64_t mtp_per_layer = 0;             // enorm + hnorm + eh_proj + one transformer layer + final norm
  int num_dense_layers = 0;
  int num_moe_layers = 0;
  int64_t decoder_layers = 0;    // sum over the main decoder layers
  int64_t mtp = 0;               // mtp_num_layers * mtp_per_layer
  int64_t total = 0;             // everything, each tied weight counted once
  int64_t active_per_token = 0;  // parameters touched by one token (MoE: top-k experts only)
};

struct ModelSpec {
  std::string name;  // preset name or "custom"

  // Transformer shape (Megatron flag names).
  int num_layers = 0;   // --num-layers (decoder layers, MTP excluded)
  int hidden_size = 0;  // --hidden-size
  int ffn_hidden_size =
      0;  // --ffn-hidden-size; 0: Megatron's default (4h, or 8h/3 rounded down to 64 with SwiGLU)
  int num_attention_heads = 0;             // --num-attention-heads
  int num_query_groups = 0;                // --num-query-groups (GQA); 0: no GQA (= heads)
  int kv_channels = 0;                     // --kv-channels (head dim); 0: hidden / heads
  int seq_length = 0;                      // --seq-length
  int max_position_embeddings = 0;         // --max-position-embeddings; 0: seq_length
  int vocab_size = 0;                      // --vocab-size (tokenizer size, unpadded)
  int make_vocab_size_divisible_by = 128;  // --make-vocab-size-divisible-by
  Normalization normalization = Normalization::kLayerNorm;
  Activation activation = Activation::kGelu;
  PositionEmbedding position_embedding = PositionEmbedding::kLearnedAbsolute;
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;  // biases in every linear layer (QKV bias follows it)
  // --qk-layernorm: the model's norm over each query and key head (one [head_dim] weight, plus a bias under
  // LayerNorm, shared by the heads) after the QKV projection and before RoPE (Qwen3's q_norm / k_norm).
  // Under multi-latent attention it is Megatron's norm of the q and kv latents, which MLA always has here.
  bool qk_layernorm = false;

  // Multi-latent attention (DeepSeek-V2/V3); used only when multi_latent_attention.
  bool multi_latent_attention = false;
  int q_lora_rank = 0;          // --q-lora-rank; 0: no query compression
  int kv_lora_rank = 0;         // --kv-lora-rank
  int qk_head_dim = 0;          // --qk-head-dim (non-rotary part)
  int qk_pos_emb_head_dim = 0;  // --qk-pos-emb-head-dim (rotary part)
  int v_head_dim = 0;           // --v-head-dim
  // Its rope type, Megatron's YaRN: --rotary-scaling-factor (1: plain RoPE), --mscale, --mscale-all-dim
  // (Megatron's defaults). Other models' RoPE does not read them, as Megatron's does not.
  double rotary_scaling_factor = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;

  // Mixture of experts.
  int num_experts = 0;                          // --num-experts; 0: dense model
  int moe_router_topk = 2;                      // --moe-router-topk
  int moe_ffn_hidden_size = 0;                  // --moe-ffn-hidden-size; 0: ffn_hidden_size
  int moe_shared_expert_intermediate_size = 0;  // --moe-shared-expert-intermediate-size; 0: none
  int moe_layer_freq = 1;              // --moe-layer-freq k: layer i is MoE iff i % k == 0 (when no pattern)
  std::vector<int> moe_layer_pattern;  // explicit 0/1 per decoder layer (overrides moe_layer_freq)

  int mtp_num_layers = 0;  // --mtp-num-layers (multi-token prediction)

  // Resolved values (the defaults above applied).
  int ffn_size() const;
  int query_groups() const;
  int head_dim() const;  // kv_channels or h / heads
  int moe_ffn_size() const;
  int max_positions() const;
  bool is_moe() const { return num_experts > 0; }
  bool is_moe_layer(int layer_index) const;  // 0-based decoder layer; false for dense models
  int num_moe_layers() const;
  bool mtp_layer_is_moe() const;  // MTP layers follow the last decoder layer's kind
  // Megatron's padding: ceil(V / (divisible_by * tp)) * divisible_by * tp.
  int64_t padded_vocab_size(int tensor_parallel_size = 1) const;

  // Throws UserError naming the flag and the fix for the first inconsistent field.
  void validate() const;

  ParameterCounts parameter_counts(int tensor_parallel_size = 1) const;
  int64_t total_parameters() const { return parameter_counts().total; }
};

// Parameters of a decoder layer's parts on one rank of a tensor-parallel split of size tp (1: the whole
// part): column-parallel linears (QKV, fc1, MLA q_up / kv_up) split their out-features and biases,
// row-parallel ones (proj, fc2) their in-features (their biases stay whole); norms, the MLA down-projections
// and the router are replicated. ModelSpec::parameter_counts and the step program's stage parameters (hence
// gradient buckets, optimizer and memory) both count with these.
int64_t norm_parameters(const ModelSpec& model);  // one LayerNorm (weight + bias) or RMSNorm
// --qk-layernorm's two head norms of a layer (q and k, each over head_dim; none without it or under MLA).
int64_t qk_norm_parameters(const ModelSpec& model);
int64_t attention_parameters(const ModelSpec& model, int tp = 1);         // input norm + attention (+ biases)
int64_t mlp_parameters(const ModelSpec& model, int64_t ffn, int tp = 1);  // fc1 + fc2 (+ biases), no norm
// Pre-MLP norm + the MLP of a dense layer, or (moe) + router + shared expert: all but the routed experts.
int64_t decoder_mlp_parameters(const ModelSpec& model, bool moe, int tp = 1);
// `experts` routed experts, each an MLP of moe_ffn_size() split over the expert-tensor-parallel size etp.
int64_t routed_expert_parameters(const ModelSpec& model, int experts, int etp = 1);
// What an MTP layer adds to its transformer layer: enorm + hnorm + eh_proj (2h -> h, column-parallel, no
// bias) + its final norm.
int64_t mtp_extra_parameters(const ModelSpec& model, int tp = 1);

// Parses Megatron's --moe-layer-freq: an integer k, a list "[0,1,1]", or Megatron's Python expression
// form "([0]*3+[1]*58)". Returns the per-layer pattern for num_layers layers. Throws UserError.
std::vector<int> parse_moe_layer_freq(std::string_view text, int num_layers);

// Named presets: tiny, gpt-125m, gpt-1.3b, gpt-2.7b, gpt3-175b, llama3-1b, llama3-3b, llama3-8b,
// llama3-70b, llama3-405b, mixtral-8x7b, deepseek-v3. Unknown names throw UserError listing the known ones.
ModelSpec model_preset(std::string_view name);
std::vector<std::string> model_preset_names();

// The shapes of ../shared/anchors/torch_gpt.py's CONFIGS (gpt-125m, gpt-1.3b, gpt-2.7b, llama-1b,
// llama-3b): untied head, vocab as the anchor holds it, GPT with biases + LayerNorm + GELU + learned
// positions, Llama with RMSNorm + SwiGLU + RoPE and no biases. Executor benchmarks compare against it.
ModelSpec torch_anchor_model(std::string_view name);
std::vector<std::string> torch_anchor_model_names();

}  // namespace megatune::layouts
