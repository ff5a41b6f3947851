// GPTModel: the core attention of a layer (the flash kernels, or the context-parallel ring) and the check
// that the backend runs its shapes.
#include <cmath>
#include <string>

#include "base/user_error.h"
#include "executor/model/gpt_model.h"
#include "executor/model/gpt_model_phases.h"

namespace megatune::executor {
namespace {

using namespace gpt_model_phases;  // NOLINT(google-build-using-namespace)

}  // namespace

AttentionArgs GPTModel::attention_args(const LayerActivations& acts) const {
  if (mla_) return mla_->attention_args(acts.mla, acts.attn, acts.lse);
  return self_attention_args(acts.qkv, acts.attn, acts.lse, batch_.micro_batch, batch_.seq,
                             shape_.heads_per_rank(), shape_.groups_per_rank(), config_.head_dim,
                             backend_.storage_bytes(compute_dtype_));
}

void GPTModel::require_attention_support() const {
  if (local_layer_count() == 0) return;
  std::string gap = backend_.attention_unsupported(attention_shape(attention_args(LayerActivations{})));
  for (const layouts::RingBlock block :
       {layouts::RingBlock::kFirstHalfKeys, layouts::RingBlock::kSecondHalfQueries})
    if (gap.empty() && cp_size_ > 1) {
      gap = backend_.attention_unsupported(ring_kernel_shape(ring_shape(), block));
      if (!gap.empty()) gap = "context parallelism's ring: " + gap;
    }
  if (!gap.empty() && config_.mla)
    throw UserError("the " + backend_.name() +
                    " backend cannot run this model's multi-latent attention (q/k " + "head dim " +
                    std::to_string(config_.head_dim) + " = --qk-head-dim + --qk-pos-emb-head-dim, " +
                    "--v-head-dim " + std::to_string(config_.v_head_dim) + "): " + gap +
                    "; pick those dims accordingly, or --device cpu");
  if (!gap.empty())
    throw UserError(
        "the " + backend_.name() + " backend cannot run this model's attention (--kv-channels " +
        std::to_string(config_.head_dim) + "): " + gap +
        "; pick --kv-channels (or --hidden-size / --num-attention-heads) accordingly, or --device cpu");
}

RingAttentionShape GPTModel::ring_shape() const {
  RingAttentionShape ring;
  ring.batch = batch_.micro_batch;
  ring.local_seq = batch_.seq;
  ring.heads = shape_.heads_per_rank();
  ring.kv_heads = shape_.groups_per_rank();
  ring.head_dim = config_.head_dim;
  ring.softmax_scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
  return ring;
}

void GPTModel::core_attention_forward(LayerActivations& a, int layer, OpPhase phase) {
  if (ring_) {
    ring_->forward(a.qkv, a.attn, a.lse, a.cp_kv, layer, phase);
    return;
  }
  backend_.attention_forward(attention_args(a), {"attn", layer, phase});
}

void GPTModel::core_attention_backward(LayerActivations& a, int layer) {
  if (ring_) {
    ring_->backward(a.qkv, a.attn, a.lse, a.cp_kv, d_attn_, d_qkv_, layer);
    return;
  }
  const AttentionArgs attention = attention_args(a);
  backend_.attention_backward(
      attention, packed_attention_grads(d_attn_, d_qkv_, attention, backend_.storage_bytes(compute_dtype_)),
      {"attn", layer, kB});
}

}  // namespace megatune::executor
