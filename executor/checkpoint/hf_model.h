// Hugging Face model folders as megatune models: config.json of GPT2LMHeadModel, LlamaForCausalLM (and
// Mistral's, the same layout), Qwen3ForCausalLM (Llama's with q_norm / k_norm: --qk-layernorm) and
// MixtralForCausalLM read into a ModelSpec and back, and the binding of each megatune parameter (Megatron
// names, unsharded) to the HF tensors it is made of.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "layouts/model_flags.h"
#include "layouts/model_spec.h"

namespace megatune::executor::checkpoint {

enum class HfArchitecture { kGpt2, kLlama, kMistral, kMixtral, kQwen3 };

struct HfModel {
  HfArchitecture architecture = HfArchitecture::kLlama;
  layouts::ModelSpec spec;  // vocab_size: the HF vocabulary (unpadded); seq_length: min(positions, 4096)
  layouts::ModelNumerics numerics;
  std::string tensor_prefix;  // GPT-2 files saved from GPT2LMHeadModel: "transformer."; from GPT2Model: ""
};

// Reads <directory>/config.json. UserError naming the file and the field for a missing or unsupported
// field (architecture, activation, rope scaling, biases megatune's layers lack, ...).
HfModel read_hf_config(const std::string& directory, int make_vocab_size_divisible_by);

// The HF architecture that holds a megatune model (GPT-2: LayerNorm, GELU, learned positions, biases;
// Llama: RMSNorm, SwiGLU, RoPE, no biases; Qwen3: Llama's with --qk-layernorm; Mixtral: Llama's with every
// layer MoE). UserError naming the feature when none does.
HfModel hf_model_of(const layouts::ModelSpec& spec, const layouts::ModelNumerics& numerics);

// config.json text for `model`; `dtype`: "float32" | "bfloat16".
std::string hf_config_text(const HfModel& model, const std::string& dtype);

// One HF tensor of a megatune parameter: its name and HF shape; `transposed`: stored (in, out) (GPT-2's
// Conv1D) where megatune stores (out, in).
struct HfPiece {
  std::string name;
  std::vector<int64_t> shape;
  bool transposed = false;
};
// A megatune parameter (e.g. decoder.layers.0.self_attention.linear_qkv.weight) is its pieces' values
// appended in order (QKV: q | k | v rows; SwiGLU fc1: gate | up rows). `vocab_rows`: the word embedding or
// output layer, whose megatune rows are the HF rows padded with zero rows to the padded vocabulary.
struct HfBinding {
  std::string parameter;
  std::vector<HfPiece> pieces;
  bool vocab_rows = false;
};
// Every parameter of the whole model (no MTP layers), in HF's order.
std::vector<HfBinding> hf_bindings(const HfModel& model);
// HF tensors a folder may hold that no parameter reads (attention-mask buffers, rotary tables, the tied
// head's copy).
bool hf_tensor_ignored(const HfModel& model, const std::string& name);

std::string to_string(HfArchitecture architecture);  // "GPT2LMHeadModel", ...

}  // namespace megatune::executor::checkpoint
