// Hugging Face config.json <-> ModelSpec, and the HF tensors of each megatune parameter.
#include "executor/checkpoint/hf_model.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/user_error.h"

namespace megatune::executor::checkpoint {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kDefaultSeqLength = 4096;

struct ConfigFile {
  std::string path;
  json value;

  bool has(const char* key) const { return value.contains(key) && !value[key].is_null(); }
  [[noreturn]] void refuse(const std::string& what) const { throw UserError(path + ": " + what); }
  int integer(const char* key) const {
    if (!has(key) || !value[key].is_number_integer() || value[key].get<long long>() <= 0)
      refuse(std::string("needs \"") + key +
             "\", a positive integer; add it (the model's own config has it)");
    return value[key].get<int>();
  }
  int integer_or(const char* key, int fallback) const { return has(key) ? integer(key) : fallback; }
  double number_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!value[key].is_number()) refuse(std::string("\"") + key + "\" is not a number");
    return value[key].get<double>();
  }
  bool flag_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!value[key].is_boolean()) refuse(std::string("\"") + key + "\" is not true or false");
    return value[key].get<bool>();
  }
  std::string text_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!value[key].is_string()) refuse(std::string("\"") + key + "\" is not a string");
    return value[key].get<std::string>();
  }
};

ConfigFile load_config(const std::string& directory) {
  ConfigFile c;
  c.path = (fs::path(directory) / "config.json").string();
  std::ifstream in(c.path);
  if (!in)
    throw UserError(c.path +
                    " does not exist; give a Hugging Face model folder (config.json + *.safetensors)");
  c.value = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (c.value.is_discarded() || !c.value.is_object()) c.refuse("is not a JSON object; re-save the model");
  return c;
}

HfModel gpt2_from(const ConfigFile& c) {
  HfModel m;
  m.architecture = HfArchitecture::kGpt2;
  layouts::ModelSpec& s = m.spec;
  s.num_layers = c.integer("n_layer");
  s.hidden_size = c.integer("n_embd");
  s.num_attention_heads = c.integer("n_head");
  s.ffn_hidden_size = c.integer_or("n_inner", 4 * s.hidden_size);
  s.max_position_embeddings = c.integer("n_positions");
  s.normalization = layouts::Normalization::kLayerNorm;
  s.activation = layouts::Activation::kGelu;
  s.position_embedding = layouts::PositionEmbedding::kLearnedAbsolute;
  s.add_bias_linear = true;
  m.numerics.norm_epsilon = c.number_or("layer_norm_epsilon", 1e-5);
  const std::string act = c.text_or("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    c.refuse("activation_function \"" + act +
             "\": megatune's GELU is the tanh approximation (gelu_new); only such models convert exactly");
  if (!c.flag_or("scale_attn_weights", true) || c.flag_or("scale_attn_by_inverse_layer_idx", false))
    c.refuse(
        "attention scaling other than 1/sqrt(head dim) (scale_attn_weights, "
        "scale_attn_by_inverse_layer_idx) is not megatune's attention");
  return m;
}

HfModel llama_from(const ConfigFile& c, HfArchitecture architecture) {
  HfModel m;
  m.architecture = architecture;
  layouts::ModelSpec& s = m.spec;
  s.num_layers = c.integer("num_hidden_layers");
  s.hidden_size = c.integer("hidden_size");
  s.num_attention_heads = c.integer("num_attention_heads");
  const int groups = c.integer_or("num_key_value_heads", s.num_attention_heads);
  if (groups != s.num_attention_heads) s.num_query_groups = groups;
  const int head_dim = c.integer_or("head_dim", s.hidden_size / s.num_attention_heads);
  if (head_dim * s.num_attention_heads != s.hidden_size) s.kv_channels = head_dim;
  s.ffn_hidden_size = c.integer("intermediate_size");
  s.max_position_embeddings = c.integer("max_position_embeddings");
  s.normalization = layouts::Normalization::kRMSNorm;
  s.activation = layouts::Activation::kSwiglu;
  s.position_embedding = layouts::PositionEmbedding::kRope;
  s.add_bias_linear = false;
  m.numerics.norm_epsilon = c.number_or("rms_norm_eps", 1e-6);
  m.numerics.rotary_base = c.number_or("rope_theta", 10000.0);
  if (c.has("rope_parameters")) {  // transformers 5 keeps rope_theta here
    const json& rope = c.value["rope_parameters"];
    if (rope.contains("rope_theta") && rope["rope_theta"].is_number())
      m.numerics.rotary_base = rope["rope_theta"].get<double>();
    if (rope.contains("rope_type") && rope["rope_type"] != "default")
      c.refuse("rope_parameters.rope_type " + rope["rope_type"].dump() +
               ": megatune runs plain RoPE only (no scaling); convert a model without rope scaling");
  }
  const auto plain_rope = [](const json& rope) {
    const json type =
        rope.is_object() ? rope.value("rope_type", rope.value("type", json("default"))) : json();
    return type == "default";
  };
  if (c.has("rope_scaling") && !plain_rope(c.value["rope_scaling"]))
    c.refuse("rope_scaling " + c.value["rope_scaling"].dump() +
             ": megatune runs plain RoPE only (no scaling); convert a model without rope scaling");
  if (c.text_or("hidden_act", "silu") != "silu")
    c.refuse("hidden_act \"" + c.text_or("hidden_act", "") + "\": megatune's gated MLP is SwiGLU (silu)");
  if (c.flag_or("attention_bias", false) || c.flag_or("mlp_bias", false))
    c.refuse("attention_bias / mlp_bias: megatune's Llama layers have no biases");
  if (c.integer_or("pretraining_tp", 1) != 1) c.refuse("pretraining_tp must be 1");
  if (architecture == HfArchitecture::kMixtral) {
    s.num_experts = c.integer("num_local_experts");
    s.moe_router_topk = c.integer("num_experts_per_tok");
    s.moe_ffn_hidden_size = s.ffn_hidden_size;
  }
  return m;
}

json llama_config(const HfModel& m, const std::string& dtype) {
  const layouts::ModelSpec& s = m.spec;
  const bool mixtral = m.architecture == HfArchitecture::kMixtral;
  const bool qwen3 = m.architecture == HfArchitecture::kQwen3;
  json c = {{"architectures", {to_string(m.architecture)}},
            {"model_type", mixtral ? "mixtral"
                           : qwen3 ? "qwen3"
                                   : "llama"},
            {"vocab_size", s.vocab_size},
            {"hidden_size", s.hidden_size},
            {"intermediate_size", mixtral ? s.moe_ffn_size() : s.ffn_size()},
            {"num_hidden_layers", s.num_layers},
            {"num_attention_heads", s.num_attention_heads},
            {"num_key_value_heads", s.query_groups()},
            {"head_dim", s.head_dim()},
            {"max_position_embeddings", s.max_positions()},
            {"rms_norm_eps", m.numerics.norm_epsilon},
            {"rope_theta", m.numerics.rotary_base},
            {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", m.numerics.rotary_base}}},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"initializer_range", 0.02},
            {"tie_word_embeddings", !s.untie_embeddings_and_output_weights},
            {"use_cache", true},
            {"dtype", dtype}};
  if (qwen3) {  // full attention in every layer
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
    c["max_window_layers"] = s.num_layers;
  }
  if (mixtral) {
    c["num_local_experts"] = s.num_experts;
    c["num_experts_per_tok"] = s.moe_router_topk;
    c["router_aux_loss_coef"] = 0.0;
    c["output_router_logits"] = false;
    c["sliding_window"] = nullptr;
  } else {
    c["mlp_bias"] = false;
    c["pretraining_tp"] = 1;
  }
  return c;
}

json gpt2_config(const HfModel& m, const std::string& dtype) {
  const layouts::ModelSpec& s = m.spec;
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", s.vocab_size},
          {"n_positions", s.max_positions()},
          {"n_embd", s.hidden_size},
          {"n_layer", s.num_layers},
          {"n_head", s.num_attention_heads},
          {"n_inner", s.ffn_size()},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", m.numerics.norm_epsilon},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"initializer_range", 0.02},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"tie_word_embeddings", !s.untie_embeddings_and_output_weights},
          {"use_cache", true},
          {"dtype", dtype}};
}

std::string layer(int l, const char* suffix) { return "decoder.layers." + std::to_string(l) + "." + suffix; }

void gpt2_bindings(const HfModel& m, std::vector<HfBinding>& out) {
  const layouts::ModelSpec& s = m.spec;
  const int64_t h = s.hidden_size, ffn = s.ffn_size(), v = s.vocab_size;
  const std::string& p = m.tensor_prefix;
  out.push_back({"embedding.word_embeddings.weight", {{p + "wte.weight", {v, h}}}, true});
  out.push_back({"embedding.position_embeddings.weight", {{p + "wpe.weight", {s.max_positions(), h}}}});
  const auto norm = [&](const std::string& megatune, const std::string& hf) {
    out.push_back({megatune + ".weight", {{hf + ".weight", {h}}}});
    out.push_back({megatune + ".bias", {{hf + ".bias", {h}}}});
  };
  for (int l = 0; l < s.num_layers; ++l) {
    const std::string hf = p + "h." + std::to_string(l) + ".";
    norm(layer(l, "input_layernorm"), hf + "ln_1");
    out.push_back(
        {layer(l, "self_attention.linear_qkv.weight"), {{hf + "attn.c_attn.weight", {h, 3 * h}, true}}});
    out.push_back({layer(l, "self_attention.linear_qkv.bias"), {{hf + "attn.c_attn.bias", {3 * h}}}});
    out.push_back(
        {layer(l, "self_attention.linear_proj.weight"), {{hf + "attn.c_proj.weight", {h, h}, true}}});
    out.push_back({layer(l, "self_attention.linear_proj.bias"), {{hf + "attn.c_proj.bias", {h}}}});
    norm(layer(l, "pre_mlp_layernorm"), hf + "ln_2");
    out.push_back({layer(l, "mlp.linear_fc1.weight"), {{hf + "mlp.c_fc.weight", {h, ffn}, true}}});
    out.push_back({layer(l, "mlp.linear_fc1.bias"), {{hf + "mlp.c_fc.bias", {ffn}}}});
    out.push_back({layer(l, "mlp.linear_fc2.weight"), {{hf + "mlp.c_proj.weight", {ffn, h}, true}}});
    out.push_back({layer(l, "mlp.linear_fc2.bias"), {{hf + "mlp.c_proj.bias", {h}}}});
  }
  norm("decoder.final_layernorm", p + "ln_f");
  if (s.untie_embeddings_and_output_weights)
    out.push_back({"output_layer.weight", {{"lm_head.weight", {v, h}}}, true});
}

void llama_bindings(const HfModel& m, std::vector<HfBinding>& out) {
  const layouts::ModelSpec& s = m.spec;
  const int64_t h = s.hidden_size, d = s.head_dim(), q = s.num_attention_heads * d, kv = s.query_groups() * d;
  const int64_t ffn = s.ffn_size(), v = s.vocab_size;
  out.push_back({"embedding.word_embeddings.weight", {{"model.embed_tokens.weight", {v, h}}}, true});
  for (int l = 0; l < s.num_layers; ++l) {
    const std::string hf = "model.layers." + std::to_string(l) + ".";
    out.push_back({layer(l, "input_layernorm.weight"), {{hf + "input_layernorm.weight", {h}}}});
    out.push_back({layer(l, "self_attention.linear_qkv.weight"),
                   {{hf + "self_attn.q_proj.weight", {q, h}},
                    {hf + "self_attn.k_proj.weight", {kv, h}},
                    {hf + "self_attn.v_proj.weight", {kv, h}}}});
    out.push_back(
        {layer(l, "self_attention.linear_proj.weight"), {{hf + "self_attn.o_proj.weight", {h, q}}}});
    if (s.qk_layernorm) {  // Qwen3's q_norm / k_norm over the head dimension
      out.push_back({layer(l, "self_attention.q_layernorm.weight"), {{hf + "self_attn.q_norm.weight", {d}}}});
      out.push_back({layer(l, "self_attention.k_layernorm.weight"), {{hf + "self_attn.k_norm.weight", {d}}}});
    }
    out.push_back({layer(l, "pre_mlp_layernorm.weight"), {{hf + "post_attention_layernorm.weight", {h}}}});
    if (s.is_moe_layer(l)) {
      const int64_t e_ffn = s.moe_ffn_size();
      const std::string moe = hf + "block_sparse_moe.";
      out.push_back({layer(l, "mlp.router.weight"), {{moe + "gate.weight", {s.num_experts, h}}}});
      for (int e = 0; e < s.num_experts; ++e) {
        const std::string hf_e = moe + "experts." + std::to_string(e) + ".";
        const std::string mt = "mlp.experts.local_experts." + std::to_string(e) + ".";
        out.push_back({layer(l, (mt + "linear_fc1.weight").c_str()),
                       {{hf_e + "w1.weight", {e_ffn, h}}, {hf_e + "w3.weight", {e_ffn, h}}}});
        out.push_back({layer(l, (mt + "linear_fc2.weight").c_str()), {{hf_e + "w2.weight", {h, e_ffn}}}});
      }
      continue;
    }
    out.push_back({layer(l, "mlp.linear_fc1.weight"),
                   {{hf + "mlp.gate_proj.weight", {ffn, h}}, {hf + "mlp.up_proj.weight", {ffn, h}}}});
    out.push_back({layer(l, "mlp.linear_fc2.weight"), {{hf + "mlp.down_proj.weight", {h, ffn}}}});
  }
  out.push_back({"decoder.final_layernorm.weight", {{"model.norm.weight", {h}}}});
  if (s.untie_embeddings_and_output_weights)
    out.push_back({"output_layer.weight", {{"lm_head.weight", {v, h}}}, true});
}

}  // namespace

std::string to_string(HfArchitecture architecture) {
  switch (architecture) {
    case HfArchitecture::kGpt2:
      return "GPT2LMHeadModel";
    case HfArchitecture::kLlama:
      return "LlamaForCausalLM";
    case HfArchitecture::kMistral:
      return "MistralForCausalLM";
    case HfArchitecture::kMixtral:
      return "MixtralForCausalLM";
    case HfArchitecture::kQwen3:
      return "Qwen3ForCausalLM";
  }
  return "";
}

HfModel read_hf_config(const std::string& directory, int make_vocab_size_divisible_by) {
  const ConfigFile c = load_config(directory);
  const std::string type = c.text_or("model_type", "");
  HfModel m;
  if (type == "gpt2") {
    m = gpt2_from(c);
  } else if (type == "llama" || type == "mistral" || type == "mixtral") {
    m = llama_from(c, type == "llama"     ? HfArchitecture::kLlama
                      : type == "mistral" ? HfArchitecture::kMistral
                                          : HfArchitecture::kMixtral);
    const json window = c.value.value("sliding_window", json());
    if (window.is_number_integer() && window.get<long long>() < m.spec.max_position_embeddings)
      c.refuse("sliding_window " + window.dump() +
               ": megatune attends to the whole sequence; set \"sliding_window\": null in a copy of the "
               "folder to convert it anyway (equal up to " +
               window.dump() + " tokens)");
  } else if (type == "qwen3") {
    m = llama_from(c, HfArchitecture::kQwen3);
    m.spec.qk_layernorm = true;  // q_norm / k_norm (RMSNorm over head_dim) before RoPE
    if (c.flag_or("use_sliding_window", false))
      c.refuse(
          "use_sliding_window true: megatune attends to the whole sequence; set \"use_sliding_window\": "
          "false in a copy of the folder to convert it anyway");
  } else if (type == "qwen2") {
    c.refuse(
        "model_type \"qwen2\": Qwen2's q/k/v biases without other linear biases are not a megatune "
        "layer yet (no --add-qkv-bias); convert a Llama, Mistral, Mixtral or GPT-2 model");
  } else {
    c.refuse("model_type \"" + type +
             "\" is not one megatune converts (gpt2, llama, mistral, mixtral, qwen3)");
  }
  m.spec.name = "custom";
  m.spec.vocab_size = c.integer("vocab_size");
  // A training default, not a model fact: the position table, up to 4096 (train --seq-length overrides it).
  m.spec.seq_length = std::min(m.spec.max_position_embeddings, kDefaultSeqLength);
  m.spec.make_vocab_size_divisible_by = make_vocab_size_divisible_by;
  // transformers' defaults: GPT-2 ties its head, Llama / Mistral / Mixtral do not.
  const bool tied_by_default = m.architecture == HfArchitecture::kGpt2;
  m.spec.untie_embeddings_and_output_weights = !c.flag_or("tie_word_embeddings", tied_by_default);
  m.spec.validate();
  return m;
}

HfModel hf_model_of(const layouts::ModelSpec& s, const layouts::ModelNumerics& numerics) {
  HfModel m;
  m.spec = s;
  m.numerics = numerics;
  const auto refuse = [&](const std::string& what) {
    throw UserError(
        "this checkpoint's model (" + what +
        ") has no Hugging Face architecture megatune writes: GPT-2 (LayerNorm, GELU, learned "
        "positions, biases) or Llama / Qwen3 (--qk-layernorm) / Mixtral (RMSNorm, SwiGLU, RoPE, no "
        "biases)");
  };
  if (s.multi_latent_attention) refuse("multi-latent attention");
  if (s.mtp_num_layers > 0) refuse("multi-token prediction layers");
  const bool gpt2 = s.normalization == layouts::Normalization::kLayerNorm &&
                    s.activation == layouts::Activation::kGelu &&
                    s.position_embedding == layouts::PositionEmbedding::kLearnedAbsolute && s.add_bias_linear;
  const bool llama = s.normalization == layouts::Normalization::kRMSNorm &&
                     s.activation == layouts::Activation::kSwiglu &&
                     s.position_embedding == layouts::PositionEmbedding::kRope && !s.add_bias_linear;
  if (gpt2) {
    if (s.qk_layernorm) refuse("GPT-2 with --qk-layernorm");
    if (s.is_moe()) refuse("GPT-2 with experts");
    if (s.query_groups() != s.num_attention_heads) refuse("GPT-2 with grouped-query attention");
    if (s.head_dim() * s.num_attention_heads != s.hidden_size) refuse("GPT-2 with --kv-channels");
    m.architecture = HfArchitecture::kGpt2;
    m.tensor_prefix = "transformer.";
    return m;
  }
  if (!llama) refuse("a mix of GPT-2 and Llama features");
  if (s.qk_layernorm) {
    if (s.is_moe()) refuse("experts with --qk-layernorm");
    m.architecture = HfArchitecture::kQwen3;
    return m;
  }
  if (s.is_moe()) {
    if (s.num_moe_layers() != s.num_layers) refuse("dense layers among MoE layers");
    if (s.moe_shared_expert_intermediate_size > 0) refuse("a shared expert");
    m.architecture = HfArchitecture::kMixtral;
    return m;
  }
  m.architecture = HfArchitecture::kLlama;
  return m;
}

std::string hf_config_text(const HfModel& model, const std::string& dtype) {
  const json c =
      model.architecture == HfArchitecture::kGpt2 ? gpt2_config(model, dtype) : llama_config(model, dtype);
  return c.dump(2) + "\n";
}

std::vector<HfBinding> hf_bindings(const HfModel& model) {
  std::vector<HfBinding> out;
  if (model.architecture == HfArchitecture::kGpt2)
    gpt2_bindings(model, out);
  else
    llama_bindings(model, out);
  return out;
}

bool hf_tensor_ignored(const HfModel& model, const std::string& name) {
  const auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with("rotary_emb.inv_freq") || ends_with(".attn.bias") || ends_with(".attn.masked_bias"))
    return true;
  return name == "lm_head.weight" && !model.spec.untie_embeddings_and_output_weights;
}

}  // namespace megatune::executor::checkpoint
