// GPTModel: --qk-layernorm's head norms. The qkv buffer of a rank is (T, [Q | K | V]) with Q of heads / tp
// heads and K of groups / tp heads, each head_dim wide; each head of Q and of K is normalized over head_dim
// (one weight, plus a bias under LayerNorm, shared by the heads) after the QKV projection and before RoPE.
// The norm kernels read contiguous rows: the Q (or K) columns are copied into a (T * heads, head_dim)
// buffer, normalized, and copied back.
#include "executor/model/gpt_model.h"

namespace megatune::executor {

void GPTModel::allocate_qk_norm_saved(LayerActivations& a) {
  const std::int64_t T = shape_.tokens, d = config_.head_dim;
  const std::int64_t q_rows = T * shape_.heads_per_rank(), k_rows = T * shape_.groups_per_rank();
  const char* saved = "saved: qk head norm inputs and statistics";
  a.q_pre = backend_.allocate(compute_dtype_, q_rows, d, saved);
  a.k_pre = backend_.allocate(compute_dtype_, k_rows, d, saved);
  if (config_.norm == NormKind::kLayerNorm) {
    a.q_mean = backend_.allocate(DType::kFP32, q_rows, 1, saved);
    a.k_mean = backend_.allocate(DType::kFP32, k_rows, 1, saved);
  }
  a.q_rstd = backend_.allocate(DType::kFP32, q_rows, 1, saved);
  a.k_rstd = backend_.allocate(DType::kFP32, k_rows, 1, saved);
}

void GPTModel::qk_norm_forward(int l, LayerActivations& a, layouts::OpPhase phase) {
  const LayerWeights w = layer_weights(model_params_, l);
  const std::int64_t T = shape_.tokens, d = config_.head_dim,
                     storage = backend_.storage_bytes(compute_dtype_);
  const std::int64_t q_width = shape_.heads_per_rank() * d, k_width = shape_.groups_per_rank() * d;
  auto one = [&](std::int64_t first_col, std::int64_t width, Tensor pre, Tensor gamma, Tensor beta,
                 Tensor mean, Tensor rstd, const char* label) {
    const Tensor columns = columns_of(a.qkv, first_col, width, storage);
    const Tensor out = carve(qk_norm_out_, 0, pre.rows, d, storage);
    backend_.copy(columns, carve(pre, 0, T, width, storage));
    backend_.norm_forward(norm_args(pre, {}, {}, gamma, beta, out, mean, rstd), {label, l, phase});
    backend_.copy(carve(out, 0, T, width, storage), columns);
  };
  one(0, q_width, a.q_pre, w.q_norm_w, w.q_norm_b, a.q_mean, a.q_rstd, "q_norm");
  one(q_width, k_width, a.k_pre, w.k_norm_w, w.k_norm_b, a.k_mean, a.k_rstd, "k_norm");
}

void GPTModel::qk_norm_backward(int l, LayerActivations& a) {
  // d_qkv_'s Q and K columns hold the gradients of the norms' outputs (RoPE's backward has run).
  const LayerWeights w = layer_weights(model_params_, l);
  const LayerWeights g = layer_weights(grads_, l);
  const std::int64_t T = shape_.tokens, d = config_.head_dim,
                     storage = backend_.storage_bytes(compute_dtype_);
  const std::int64_t q_width = shape_.heads_per_rank() * d, k_width = shape_.groups_per_rank() * d;
  auto one = [&](std::int64_t first_col, std::int64_t width, Tensor pre, Tensor gamma, Tensor beta,
                 Tensor mean, Tensor rstd, Tensor d_gamma, Tensor d_beta, const char* label) {
    const Tensor columns = columns_of(d_qkv_, first_col, width, storage);
    const Tensor d_out = carve(qk_norm_out_, 0, pre.rows, d, storage);
    const Tensor d_in = carve(qk_norm_grad_, 0, pre.rows, d, storage);
    backend_.copy(columns, carve(d_out, 0, T, width, storage));
    backend_.norm_backward(norm_args(pre, {}, {}, gamma, beta, {}, mean, rstd), d_out, {}, d_in, d_gamma,
                           config_.norm == NormKind::kLayerNorm ? d_beta : Tensor{},
                           {label, l, layouts::OpPhase::kBackward});
    backend_.copy(carve(d_in, 0, T, width, storage), columns);
  };
  one(0, q_width, a.q_pre, w.q_norm_w, w.q_norm_b, a.q_mean, a.q_rstd, g.q_norm_w, g.q_norm_b, "q_norm");
  one(q_width, k_width, a.k_pre, w.k_norm_w, w.k_norm_b, a.k_mean, a.k_rstd, g.k_norm_w, g.k_norm_b,
      "k_norm");
}

}  // namespace megatune::executor
