// The tiny models the parallel-layout tests train: the `tiny` preset with 4 layers (so that pp4 and pp2 x
// vpp2 have work) in its Llama flavour (RMSNorm, SwiGLU, RoPE, GQA) and a GPT flavour (LayerNorm, GELU,
// learned positions, biases), tied or untied; and the `tiny-deepseek-v3-mla` preset (multi-latent attention),
// with or without query compression.
#pragma once
#include "layouts/model_spec.h"

namespace megatune::executor::test {

inline layouts::ModelSpec llama_tiny(bool tied) {
  layouts::ModelSpec m = layouts::model_preset("tiny");
  m.num_layers = 4;
  m.untie_embeddings_and_output_weights = !tied;
  return m;
}

inline layouts::ModelSpec gpt_tiny(bool tied) {
  layouts::ModelSpec m = llama_tiny(tied);
  m.normalization = layouts::Normalization::kLayerNorm;
  m.activation = layouts::Activation::kGelu;
  m.position_embedding = layouts::PositionEmbedding::kLearnedAbsolute;
  m.add_bias_linear = true;
  m.num_query_groups = 0;
  m.ffn_hidden_size = 4 * m.hidden_size;
  return m;
}

inline layouts::ModelSpec deepseek_mla_tiny(bool q_lora) {
  layouts::ModelSpec m = layouts::model_preset("tiny-deepseek-v3-mla");
  if (!q_lora) m.q_lora_rank = 0;
  return m;
}

}  // namespace megatune::executor::test
