// Small model shapes shared by the executor tests. The GPU tests: 2 layers, hidden 256, 4 heads of 64, ffn
// 512, in GPT form (LayerNorm, GELU, learned positions, biases, tied head) or Llama form (RMSNorm, SwiGLU,
// RoPE, GQA 4/2, no biases, untied head).
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

// The shapes of the finite-difference gradient checks: 2 layers, hidden 16, vocab 32, 8 positions, init std
// 0.2; GPT form (2 heads of 8, ffn 32, LayerNorm, GELU, learned positions, biases, tied head) or Llama form
// (GQA 4/2 heads of 4, RMSNorm, SwiGLU, RoPE, no biases, untied head).
inline TransformerConfig gradient_check_model(bool llama) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden = 16;
  c.heads = llama ? 4 : 2;
  c.kv_heads = 2;
  c.head_dim = llama ? 4 : 8;
  c.ffn_hidden = 32;
  c.vocab_size = 32;
  c.max_seq = 8;
  c.init_std = 0.2f;
  if (llama) {
    c.norm = NormKind::kRMSNorm;
    c.activation = ActivationKind::kSwiglu;
    c.position = PositionEmbedding::kRope;
    c.tied_embeddings = false;
    c.bias = false;
  }
  return c;
}

}  // namespace megatune::executor::test
