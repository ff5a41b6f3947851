// Named model presets (published shapes) and the shapes of the PyTorch peer anchor.
#include <string>

#include "base/user_error.h"
#include "layouts/model_spec.h"

namespace megatune::layouts {

namespace {

ModelSpec gpt(std::string name, int layers, int hidden, int heads) {
  ModelSpec m;
  m.name = std::move(name);
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.ffn_hidden_size = 4 * hidden;
  m.num_attention_heads = heads;
  m.seq_length = 2048;
  m.max_position_embeddings = 2048;
  m.vocab_size = 50257;  // GPT-2 BPE
  m.normalization = Normalization::kLayerNorm;
  m.activation = Activation::kGelu;
  m.position_embedding = PositionEmbedding::kLearnedAbsolute;
  m.untie_embeddings_and_output_weights = false;
  m.add_bias_linear = true;
  return m;
}

ModelSpec llama(std::string name, int layers, int hidden, int heads, int groups, int ffn, bool tied) {
  ModelSpec m;
  m.name = std::move(name);
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.ffn_hidden_size = ffn;
  m.num_attention_heads = heads;
  m.num_query_groups = groups;
  m.seq_length = 8192;
  m.max_position_embeddings = 131072;
  m.vocab_size = 128256;
  m.normalization = Normalization::kRMSNorm;
  m.activation = Activation::kSwiglu;
  m.position_embedding = PositionEmbedding::kRope;
  m.untie_embeddings_and_output_weights = !tied;
  m.add_bias_linear = false;
  return m;
}

// Mixtral: Llama attention with 8 GQA groups and an untied head, every layer 8 SwiGLU experts of
// expert_ffn (top-2), Mistral's 32000-token vocabulary.
ModelSpec mixtral(std::string name, int layers, int hidden, int heads, int expert_ffn, int seq,
                  int max_positions) {
  ModelSpec m = llama(std::move(name), layers, hidden, heads, 8, expert_ffn, /*tied=*/false);
  m.vocab_size = 32000;
  m.seq_length = seq;
  m.max_position_embeddings = max_positions;
  m.num_experts = 8;
  m.moe_router_topk = 2;
  m.moe_ffn_hidden_size = expert_ffn;
  return m;
}

ModelSpec make_preset(std::string_view name) {
  if (name == "tiny") {
    // Llama-style, small enough for CPU training tests: GQA, SwiGLU, RMSNorm, RoPE, untied head.
    ModelSpec m = llama("tiny", 2, 64, 4, 2, 128, /*tied=*/false);
    m.seq_length = 32;
    m.max_position_embeddings = 32;
    m.vocab_size = 256;  // byte-level
    return m;
  }
  if (name == "tiny-mixtral") {
    // Mixtral-shaped (every layer MoE, 8 experts, top-2, no shared expert) at the tiny preset's size.
    ModelSpec m = make_preset("tiny");
    m.name = "tiny-mixtral";
    m.num_experts = 8;
    m.moe_router_topk = 2;
    m.moe_ffn_hidden_size = 64;
    return m;
  }
  if (name == "tiny-deepseek-v3") {
    // DeepSeek-V3's MoE shape at the tiny preset's size (standard attention, no MTP): a first dense layer,
    // then MoE layers of 16 fine-grained experts (top-4) and one shared expert.
    ModelSpec m = make_preset("tiny");
    m.name = "tiny-deepseek-v3";
    m.num_layers = 4;
    m.num_experts = 16;
    m.moe_router_topk = 4;
    m.moe_ffn_hidden_size = 32;
    m.moe_shared_expert_intermediate_size = 32;
    m.moe_layer_pattern = {0, 1, 1, 1};
    return m;
  }
  if (name == "tiny-deepseek-v3-mla") {
    // DeepSeek-V3's attention at CPU-test size: multi-latent attention (q and kv latents, decoupled RoPE,
    // q/k heads of 24 + 8, v heads of 16) on a dense Llama-style body.
    ModelSpec m = llama("tiny-deepseek-v3-mla", 4, 64, 4, 0, 128, /*tied=*/false);
    m.seq_length = 32;
    m.max_position_embeddings = 32;
    m.vocab_size = 256;  // byte-level
    m.multi_latent_attention = true;
    m.qk_layernorm = true;  // the latent norms (Megatron's --qk-layernorm under MLA)
    m.q_lora_rank = 32;
    m.kv_lora_rank = 32;
    m.qk_head_dim = 24;
    m.qk_pos_emb_head_dim = 8;
    m.v_head_dim = 16;
    return m;
  }
  if (name == "tiny-deepseek-v3-full") {
    // Every DeepSeek-V3 feature of the model at CPU-test size: tiny-deepseek-v3-mla's multi-latent attention,
    // tiny-deepseek-v3's MoE (a first dense layer, 16 fine-grained experts top-4, one shared expert) and one
    // multi-token-prediction layer. The router (sigmoid scores, expert bias) is set by the training flags.
    ModelSpec m = make_preset("tiny-deepseek-v3-mla");
    m.name = "tiny-deepseek-v3-full";
    const ModelSpec moe = make_preset("tiny-deepseek-v3");
    m.num_experts = moe.num_experts;
    m.moe_router_topk = moe.moe_router_topk;
    m.moe_ffn_hidden_size = moe.moe_ffn_hidden_size;
    m.moe_shared_expert_intermediate_size = moe.moe_shared_expert_intermediate_size;
    m.moe_layer_pattern = moe.moe_layer_pattern;
    m.mtp_num_layers = 1;
    return m;
  }
  // GPT-3 paper shapes (Brown et al. 2020, Table 2.1), GPT-2 vocabulary, 2048 positions.
  if (name == "gpt-125m") return gpt("gpt-125m", 12, 768, 12);
  if (name == "gpt-1.3b") return gpt("gpt-1.3b", 24, 2048, 16);
  if (name == "gpt-2.7b") return gpt("gpt-2.7b", 32, 2560, 32);
  if (name == "gpt3-175b") return gpt("gpt3-175b", 96, 12288, 96);
  // Llama 3 / 3.1 / 3.2 (Meta model cards and config.json).
  if (name == "llama3-1b") return llama("llama3-1b", 16, 2048, 32, 8, 8192, /*tied=*/true);
  if (name == "llama3-3b") return llama("llama3-3b", 28, 3072, 24, 8, 8192, /*tied=*/true);
  if (name == "llama3-8b") return llama("llama3-8b", 32, 4096, 32, 8, 14336, /*tied=*/false);
  if (name == "llama3-70b") return llama("llama3-70b", 80, 8192, 64, 8, 28672, /*tied=*/false);
  if (name == "llama3-405b") return llama("llama3-405b", 126, 16384, 128, 8, 53248, /*tied=*/false);
  if (name == "mixtral-8x7b") return mixtral("mixtral-8x7b", 32, 4096, 32, 14336, 4096, 32768);
  // Mixtral's block at a size one GPU trains with EP 1 (the MoE peer's shape, bench/peer/torch_moe.py).
  if (name == "mixtral-small") return mixtral("mixtral-small", 8, 2048, 16, 4096, 2048, 4096);
  if (name == "deepseek-v3") {
    // DeepSeek-V3 (arXiv 2412.19437): MLA, 3 dense layers then 58 MoE layers of 256 routed experts
    // (top-8) + 1 shared expert, one MTP module. The router's node-limited routing and aux-loss-free
    // bias do not change shapes or FLOPs.
    ModelSpec m = llama("deepseek-v3", 61, 7168, 128, 0, 18432, /*tied=*/false);
    m.vocab_size = 129280;
    m.seq_length = 4096;
    m.max_position_embeddings = 163840;
    m.multi_latent_attention = true;
    m.qk_layernorm = true;  // the latent norms (Megatron's --qk-layernorm under MLA)
    m.q_lora_rank = 1536;
    m.kv_lora_rank = 512;
    m.qk_head_dim = 128;
    m.qk_pos_emb_head_dim = 64;
    m.v_head_dim = 128;
    m.kv_channels = 128;
    m.num_experts = 256;
    m.moe_router_topk = 8;
    m.moe_ffn_hidden_size = 2048;
    m.moe_shared_expert_intermediate_size = 2048;
    m.moe_layer_pattern.assign(61, 1);
    for (int i = 0; i < 3; ++i) m.moe_layer_pattern[i] = 0;
    m.mtp_num_layers = 1;
    return m;
  }
  std::string known;
  for (const auto& preset : model_preset_names()) {
    known += known.empty() ? "" : ", ";
    known += preset;
  }
  throw UserError("--model '" + std::string(name) + "' is not a known preset: use one of " + known +
                  " (or give the shape with --num-layers, --hidden-size, ...)");
}

}  // namespace

std::vector<std::string> model_preset_names() {
  return {"tiny",
          "tiny-mixtral",
          "tiny-deepseek-v3",
          "gpt-125m",
          "gpt-1.3b",
          "gpt-2.7b",
          "gpt3-175b",
          "llama3-1b",
          "llama3-3b",
          "llama3-8b",
          "llama3-70b",
          "llama3-405b",
          "mixtral-small",
          "mixtral-8x7b",
          "deepseek-v3",
          "tiny-deepseek-v3-mla",
          "tiny-deepseek-v3-full"};
}

ModelSpec model_preset(std::string_view name) { return make_preset(name); }

std::vector<std::string> torch_anchor_model_names() {
  return {"gpt-125m", "gpt-1.3b", "gpt-2.7b", "llama-1b", "llama-3b"};
}

ModelSpec torch_anchor_model(std::string_view name) {
  // ../shared/anchors/torch_gpt.py CONFIGS: layers, hidden, heads, kv_heads, ffn, vocab, seq, swiglu.
  struct AnchorShape {
    const char* name;
    int layers, hidden, heads, kv_heads, ffn, vocab, seq;
    bool swiglu;
  };
  static constexpr AnchorShape kShapes[] = {
      {"gpt-125m", 12, 768, 12, 12, 3072, 50304, 1024, false},
      {"gpt-1.3b", 24, 2048, 16, 16, 8192, 50304, 2048, false},
      {"llama-1b", 16, 2048, 32, 8, 8192, 128256, 4096, true},
      {"llama-3b", 28, 3072, 24, 8, 8192, 128256, 4096, true},
      {"gpt-2.7b", 32, 2560, 32, 32, 10240, 50304, 2048, false},
  };
  for (const AnchorShape& shape : kShapes) {
    if (name != shape.name) continue;
    ModelSpec m;
    m.name = std::string("anchor-") + shape.name;
    m.num_layers = shape.layers;
    m.hidden_size = shape.hidden;
    m.num_attention_heads = shape.heads;
    m.num_query_groups = shape.kv_heads;
    m.ffn_hidden_size = shape.ffn;
    m.vocab_size = shape.vocab;
    m.seq_length = shape.seq;
    m.max_position_embeddings = shape.seq;
    m.untie_embeddings_and_output_weights = true;  // the anchor's head is its own Linear
    if (shape.swiglu) {
      m.normalization = Normalization::kRMSNorm;
      m.activation = Activation::kSwiglu;
      m.position_embedding = PositionEmbedding::kRope;
      m.add_bias_linear = false;
    } else {
      m.normalization = Normalization::kLayerNorm;
      m.activation = Activation::kGelu;
      m.position_embedding = PositionEmbedding::kLearnedAbsolute;
      m.add_bias_linear = true;
    }
    return m;
  }
  std::string known;
  for (const auto& anchor : torch_anchor_model_names()) {
    known += known.empty() ? "" : ", ";
    known += anchor;
  }
  throw UserError("anchor model '" + std::string(name) + "' is not in torch_gpt.py's CONFIGS: use one of " +
                  known);
}

}  // namespace megatune::layouts
