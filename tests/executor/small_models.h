// Small model shapes shared by the executor's GPU tests: 2 layers, hidden 256, 4 heads of 64, ffn 512, in
// GPT form (LayerNorm, GELU, learned positions, biases, tied head) or Llama form (RMSNorm, SwiGLU, RoPE,
// GQA 4/2, no biases, untied head).
#pragma once
#include <cstdint>

#include "executor/model/transformer_config.h"

namespace megatune::executor::test {

inline TransformerConfig two_layer_model(bool llama, std::int64_t vocab, std::int64_t max_seq) {
  TransformerConfig m;
  m.num_layers = 2;
  m.hidden = 256;
  m.heads = 4;
  m.kv_heads = llama ? 2 : 4;
  m.head_dim = 64;
  m.ffn_hidden = 512;
  m.vocab_size = vocab;
  m.max_seq = max_seq;
  if (llama) {
    m.norm = NormKind::kRMSNorm;
    m.activation = ActivationKind::kSwiglu;
    m.position = PositionEmbedding::kRope;
    m.tied_embeddings = false;
    m.bias = false;
  }
  return m;
}

}  // namespace megatune::executor::test
