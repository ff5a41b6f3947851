// TransformerConfig: the model shape the executor builds (a GPT/Llama family member on one TP shard).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/model/moe_router.h"
#include "layouts/fp8.h"
#include "layouts/rank_shape.h"

namespace megatune::executor {

enum class PositionEmbedding { kLearned, kRope };

struct TransformerConfig {
  int num_layers = 2;
  std::int64_t hidden = 64;
  std::int64_t heads = 4;
  std::int64_t kv_heads = 4;  // query groups (GQA); == heads for MHA
  std::int64_t head_dim = 16;
  std::int64_t ffn_hidden = 256;
  std::int64_t vocab_size = 256;  // padded vocabulary (Megatron pads to a multiple of 128 * tp)
  std::int64_t max_seq = 64;      // positions of the learned position table
  NormKind norm = NormKind::kLayerNorm;
  ActivationKind activation = ActivationKind::kGelu;
  PositionEmbedding position = PositionEmbedding::kLearned;
  float rope_theta = 10000.0f;
  bool tied_embeddings = true;
  bool bias = true;  // biases on the linear layers
  // --qk-layernorm: the norm (kind `norm`) of each query and key head over head_dim after the QKV projection
  // and before RoPE, one weight (+ bias) per q and per k shared by the heads. False under MLA, whose latent
  // norms are always there.
  bool qk_layernorm = false;
  float norm_eps = 1e-5f;
  float init_std = 0.02f;
  int tensor_parallel_size = 1;    // shapes below are per TP rank when > 1
  bool sequence_parallel = false;  // --sequence-parallel (tp > 1): norms and residuals on sequence shards
  // Multi-latent attention (--multi-latent-attention): head_dim is then qk_head_dim + qk_pos_emb_head_dim
  // (queries and keys), kv_heads == heads; q_lora_rank 0 is one query projection.
  bool mla = false;
  std::int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_head_dim = 0, qk_pos_emb_head_dim = 0, v_head_dim = 0;
  // MLA's rope type, YaRN (Megatron's default for multi-latent attention): --rotary-scaling-factor,
  // --mscale, --mscale-all-dim; factor 1 is plain RoPE.
  YarnSettings yarn;
  // Mixture of experts (num_experts == 0: dense). moe_layers[l] != 0: layer l is an MoE layer.
  std::vector<int> moe_layers;
  std::int64_t num_experts = 0;
  std::int64_t moe_ffn_hidden = 0;     // --moe-ffn-hidden-size
  std::int64_t shared_expert_ffn = 0;  // --moe-shared-expert-intermediate-size; 0: none
  MoeRouterConfig router;              // top-k, score function, load balancing, capacity
  int expert_parallel_size = 1;        // --expert-model-parallel-size; experts below are per EP rank
  int expert_parallel_rank = 0;
  // --expert-tensor-parallel-size: each routed expert's fc1 column- and fc2 row-split over this many ranks
  // (the expert-tensor-parallel group, Megatron's expert grid etp x ep x edp x pp); this rank's index in it.
  int expert_tensor_parallel_size = 1;
  int expert_tensor_parallel_rank = 0;
  // --moe-token-dispatcher-type allgather: tokens gathered over the tp-ep group (not a model fact: left out
  // of describe(), so checkpoints move between dispatchers).
  bool moe_allgather_dispatcher = false;
  // Multi-token prediction: MTP layers (numbered -3 - k) follow the last decoder layer's kind.
  int mtp_num_layers = 0;                // --mtp-num-layers
  float mtp_loss_scaling_factor = 0.1f;  // --mtp-loss-scaling-factor (Megatron's default)
  // FP8 training (--fp8-format, --fp8-recipe, ...): which linears and how, layouts/fp8.h. Not a model fact
  // (left out of describe(): checkpoints move between bf16 and FP8 runs).
  layouts::Fp8Settings fp8;

  // What one TP rank holds of these sizes: rank_shape below.
  bool is_moe() const { return num_experts > 0; }
  bool is_moe_layer(int layer) const {
    if (layer <= -3) layer = num_layers - 1;  // an MTP layer
    return layer >= 0 && layer < static_cast<int>(moe_layers.size()) && moe_layers[layer] != 0;
  }
  // Throws UserError naming the bad field.
  void validate() const;
  std::string describe() const;
};

}  // namespace megatune::executor

namespace megatune::layouts {
struct ModelSpec;
}

namespace megatune::executor {

// The layouts' shape of `config` on its rank: the model's dimensions and what one TP rank holds of them,
// the tensor-, expert- and expert-tensor-parallel sizes, the rank's expert-parallel index and, for
// micro-batches of `micro_batch` sequences of `seq` tokens (the whole sequence) over `cp` context-parallel
// ranks, the tokens (none when micro_batch is 0).
layouts::RankShape rank_shape(const TransformerConfig& config, std::int64_t micro_batch = 0,
                              std::int64_t seq = 0, int cp = 1);

// The executor's shape of a layouts::ModelSpec on one TP rank (vocabulary padded like Megatron); MoE layers
// with the router's defaults (top-k from the spec). UserError for features the executor does not run yet
// (MoE with tensor parallelism or linear biases).
TransformerConfig transformer_config_from(const layouts::ModelSpec& spec, int tensor_parallel_size,
                                          float rope_theta, float norm_eps, float init_std);

}  // namespace megatune::executor
