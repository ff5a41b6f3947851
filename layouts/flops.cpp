// Model FLOPs (Megatron's num_floating_point_operations) and MFU (the GPU peaks are the hardware catalog's).
#include "layouts/flops.h"

#include <cctype>
#include <string>

#include "base/user_error.h"

namespace megatune::layouts {

FlopsBreakdown model_flops_breakdown(const ModelSpec& model, int64_t global_batch_size,
                                     int tensor_model_parallel_size) {
  const double h = model.hidden_size;
  const double s = model.seq_length;
  const double tokens = static_cast<double>(global_batch_size) * s;                // T = B s
  const double tokens_times_seq = static_cast<double>(global_batch_size) * s * s;  // S2 = B s^2
  const double vocab = static_cast<double>(model.padded_vocab_size(tensor_model_parallel_size));
  const double gated = model.activation == Activation::kSwiglu ? 3.0 : 2.0;  // f
  const double mtp_layers = model.mtp_num_layers;

  double moe_layers = 0, dense_layers = 0;
  for (int i = 0; i < model.num_layers; ++i) (model.is_moe_layer(i) ? moe_layers : dense_layers) += 1;
  // MTP layers count as extra layers of the last layer's kind.
  (model.is_moe_layer(model.num_layers - 1) ? moe_layers : dense_layers) += mtp_layers;
  const double attention_layers = model.num_layers + mtp_layers;

  const double ffn = model.ffn_size();
  const double moe_ffn = model.is_moe() ? model.moe_ffn_size() : 0.0;
  const double topk = model.is_moe() ? model.moe_router_topk : 0.0;
  const double shared_ffn = model.moe_shared_expert_intermediate_size;

  double attention_linear_per_layer = 0, attention_core_per_layer = 0;
  const double heads = model.num_attention_heads;
  if (model.multi_latent_attention) {
    const double d_qk = model.qk_head_dim, d_rope = model.qk_pos_emb_head_dim, d_v = model.v_head_dim;
    const double r_q = model.q_lora_rank, r_kv = model.kv_lora_rank;
    const double q_term =
        model.q_lora_rank > 0 ? r_q * (h + heads * (d_qk + d_rope) + 1) : h * heads * (d_qk + d_rope);
    attention_linear_per_layer =
        6 * (q_term + r_kv * (h + heads * (d_qk + d_v) + 1) + h * d_rope + heads * d_v * h);
    attention_core_per_layer = 6 * (heads * (d_qk + d_rope) / 2 + heads * d_v / 2);
  } else {
    const double q = static_cast<double>(model.head_dim()) * heads;
    const double kv = static_cast<double>(model.head_dim()) * model.query_groups();
    attention_linear_per_layer = 6 * (h * (q + 2 * kv) + q * h);
    attention_core_per_layer = 6 * q;
  }

  FlopsBreakdown f;
  f.mlp = tokens * 6 * h *
          (ffn * gated * dense_layers + (moe_ffn * topk * gated + shared_ffn * gated) * moe_layers);
  f.attention_linear = tokens * attention_linear_per_layer * attention_layers;
  f.attention_core = tokens_times_seq * attention_core_per_layer * attention_layers;
  f.mtp = tokens * 6 * mtp_layers * (3 * h + 2 * h * h);
  f.logits = tokens * 6 * h * vocab * (mtp_layers + 1);
  f.total = f.mlp + f.attention_linear + f.attention_core + f.mtp + f.logits;
  return f;
}

double model_flops_per_iteration(const ModelSpec& model, int64_t global_batch_size,
                                 int tensor_model_parallel_size) {
  return model_flops_breakdown(model, global_batch_size, tensor_model_parallel_size).total;
}

double mfu(double flops, double step_time_s, int gpus, double peak_tflops_per_gpu) {
  if (step_time_s <= 0 || gpus <= 0 || peak_tflops_per_gpu <= 0) return 0.0;
  return flops / (step_time_s * gpus * peak_tflops_per_gpu * 1e12);
}

}  // namespace megatune::layouts
