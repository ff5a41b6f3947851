// RankShape: the shape of a (model, layout) on one rank, resolved once: the model's dimensions and what one
// tensor-parallel rank holds of them (heads, query groups, ffn, expert ffn, vocabulary), the tokens of a
// micro-batch (and their sequence-parallel shard), the parallel sizes and the recomputation flags. The step
// program, the parameter table, the planner's memory model and the executor's model read their shapes here
// instead of dividing by tp themselves.
#pragma once
#include <cstdint>
#include <vector>

#include "layouts/model_spec.h"
#include "layouts/op.h"
#include "layouts/parallel_config.h"
#include "layouts/recompute_plan.h"

namespace megatune::layouts {

struct RankShape {
  // Tokens per micro-batch on a rank: T = (s / cp) * b; with sequence parallelism the norms, residuals and
  // p2p tensors hold T / tp of them.
  std::int64_t seq = 0, seq_local = 0, micro_batch = 0, tokens = 0, tokens_sp = 0;
  // Model dimensions (whole model). groups: query groups (heads under MLA); head_dim of the queries and keys
  // (qk_head_dim + qk_pos_emb_head_dim under MLA), head_dim_v of the values (v_head_dim under MLA; 0:
  // head_dim).
  std::int64_t hidden = 0, heads = 0, groups = 0, head_dim = 0, ffn = 0, moe_ffn = 0, shared_ffn = 0;
  std::int64_t head_dim_v = 0;
  std::int64_t vocab_padded = 0, experts = 0, topk = 0;  // vocabulary padded like Megatron (128 * tp)
  std::int64_t max_positions = 0;                        // rows of the learned position table
  int tp = 1, cp = 1, ep = 1, etp = 1, dp = 1, edp = 1, pp = 1;
  bool sp = false, swiglu = false, rms = false, rope = false, tied = true, mla = false, bias = false;
  // --qk-layernorm's head norms (before RoPE, over head_dim, weights replicated over TP while each rank
  // normalizes its own heads: their gradients are summed over TP). Never under MLA (its latent norms).
  bool qk_norm = false;
  MoeDispatcher moe_dispatcher = MoeDispatcher::kAllToAll;  // ParallelConfig::moe_token_dispatcher_type
  int num_layers = 0,
      mtp_num_layers = 0;  // decoder layers; MTP layers (the final norm then follows the last)
  // Multi-latent attention (--multi-latent-attention): q_lora_rank 0 is one query projection.
  std::int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_head_dim = 0, qk_pos_emb_head_dim = 0, v_head_dim = 0;
  // Mixture of experts: moe_layers[l] != 0 makes decoder layer l an MoE layer (empty: a dense model). Each
  // MoE layer holds a router (experts, h), the experts of this expert-parallel rank (experts / ep of them,
  // from ep_rank * experts / ep; fc1 and fc2 of moe_ffn, no biases; fc1 column-parallel and fc2
  // row-parallel over the etp expert-tensor-parallel ranks) and, when shared_ffn > 0, a shared expert (an
  // MLP of shared_ffn split over TP like the dense MLP, no biases).
  std::vector<int> moe_layers;
  int ep_rank = 0;
  RecomputeGranularity recompute = RecomputeGranularity::kNone;
  RecomputeMethod recompute_method = RecomputeMethod::kNone;  // full recomputation's unit rule
  int recompute_num_layers = 0;
  std::int64_t p2p_bytes = 0;  // one pipeline activation (or gradient) tensor
  // The rank's place in its context-parallel ring (walk_rank_step sets it per rank): CP index and the global
  // ranks of the next and previous members.
  struct ContextRing {
    int cp_rank = 0, next_rank = -1, prev_rank = -1;
  } cp_ring;

  // What one tensor-parallel rank holds (the dense MLP, the shared expert and the vocabulary split over tp,
  // a routed expert's ffn over etp).
  std::int64_t heads_per_rank() const { return heads / tp; }
  std::int64_t groups_per_rank() const { return groups / tp; }
  std::int64_t ffn_per_rank() const { return ffn / tp; }
  std::int64_t shared_ffn_per_rank() const { return shared_ffn / tp; }
  std::int64_t moe_ffn_per_rank() const { return moe_ffn / etp; }
  std::int64_t vocab_per_rank() const { return vocab_padded / tp; }
  std::int64_t local_experts() const { return experts / ep; }
  std::int64_t glu_factor() const { return swiglu ? 2 : 1; }
  // The fused QKV projection's out-features on one rank (0 under MLA, which has no fused projection).
  std::int64_t qkv_width() const { return mla ? 0 : (heads + 2 * groups) * head_dim / tp; }
  std::int64_t fc1_width() const { return glu_factor() * ffn_per_rank(); }  // SwiGLU: [gate | up]
  std::int64_t value_head_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  // The core attention's output features on one rank (proj's in-features).
  std::int64_t attention_width() const { return heads_per_rank() * value_head_dim(); }
  // The core attention of one micro-batch on this rank: heads / tp query heads, groups / tp (at least one)
  // kv heads, the local queries over the whole sequence, causal.
  AttentionShape attention() const;

  // The TP all-reduce of the replicated parameters' gradients after the schedule: the norms' under SP,
  // the qk head norms' whenever tp > 1.
  bool reduces_replicated_grads() const { return sp || (qk_norm && tp > 1); }

  bool is_moe_layer(int layer) const {
    return layer >= 0 && layer < static_cast<int>(moe_layers.size()) && moe_layers[layer] != 0;
  }
  bool is_moe_mtp_layer() const { return is_moe_layer(num_layers - 1); }
  // The stage holding decoder layer num_layers - 1 holds the final norm when MTP is on, else the loss stage.
  bool final_norm_with_last_layer() const { return mtp_num_layers > 0; }
  RecomputeSettings recompute_settings() const { return {recompute, recompute_method, recompute_num_layers}; }
};

// Sets the tokens of a micro-batch of `micro_batch` sequences of `seq` (seq, seq_local, micro_batch,
// tokens, tokens_sp, p2p_bytes) from the shape's cp, tp and sp.
void resolve_tokens(RankShape& shape, std::int64_t seq, std::int64_t micro_batch);

// The shape of a validated (model, config) on its ranks; ep_rank is the rank's expert-parallel index (it
// selects which experts the parameter table lists, not their counts).
RankShape resolve_rank_shape(const ModelSpec& model, const ParallelConfig& config, int ep_rank = 0);

}  // namespace megatune::layouts
