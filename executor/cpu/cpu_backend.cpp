// CpuBackend: host memory arena and the reference kernels behind the Backend interface.
#include "executor/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "executor/kernels/attention_shape.h"
#include "executor/kernels/reference_activation.h"
#include "executor/kernels/reference_attention.h"
#include "executor/kernels/reference_attention_merge.h"
#include "executor/kernels/reference_cross_entropy.h"
#include "executor/kernels/reference_elementwise.h"
#include "executor/kernels/reference_embedding.h"
#include "executor/kernels/reference_fp8.h"
#include "executor/kernels/reference_gemm.h"
#include "executor/kernels/reference_norm.h"
#include "executor/kernels/reference_optimizer.h"
#include "executor/kernels/reference_rope.h"

namespace megatune::executor {
namespace {

float* f32(Tensor t) { return static_cast<float*>(t.data); }
const std::int32_t* i32(Tensor t) { return static_cast<const std::int32_t*>(t.data); }

void require_contiguous_cpu(const Tensor& t, const char* what) {
  if (!t.contiguous()) throw std::logic_error(std::string("cpu backend: ") + what + " must be contiguous");
}

}  // namespace

void* CpuBackend::reserve_memory(std::int64_t bytes) {
  arena_ = std::make_unique<float[]>(static_cast<std::size_t>((bytes + 3) / 4));
  return arena_.get();
}

void* CpuBackend::reserve_block(std::int64_t bytes) {
  blocks_.push_back(std::make_unique<float[]>(static_cast<std::size_t>((bytes + 3) / 4)));
  return blocks_.back().get();
}

void CpuBackend::free_block(void* block) {
  const auto held = std::find_if(blocks_.begin(), blocks_.end(),
                                 [&](const std::unique_ptr<float[]>& b) { return b.get() == block; });
  if (held == blocks_.end()) throw std::logic_error("CpuBackend::free_block: not a block of this backend");
  blocks_.erase(held);
}

void CpuBackend::round_if_bf16(Tensor t) {
  if (!emulate_bf16_ || t.is_int32 || t.dtype != DType::kBF16) return;
  for (std::int64_t r = 0; r < t.rows; ++r)
    reference::round_to_bf16_inplace(f32(t) + r * t.row_stride, t.cols);
}

// Zero-element tensors (an empty pipeline stage's parameters) move nothing; their pointers may be null.
void CpuBackend::do_upload(Tensor dst, const float* host, Stream) {
  if (dst.numel() == 0) return;
  for (std::int64_t r = 0; r < dst.rows; ++r)
    std::memcpy(f32(dst) + r * dst.row_stride, host + r * dst.cols, sizeof(float) * dst.cols);
  round_if_bf16(dst);
}

void CpuBackend::do_download(Tensor src, float* host, Stream) {
  if (src.numel() == 0) return;
  for (std::int64_t r = 0; r < src.rows; ++r)
    std::memcpy(host + r * src.cols, f32(src) + r * src.row_stride, sizeof(float) * src.cols);
}

void CpuBackend::upload_int32(Tensor dst, const std::int32_t* host) {
  require_contiguous_cpu(dst, "token tensor");
  if (dst.numel() == 0) return;
  std::memcpy(dst.data, host, sizeof(std::int32_t) * dst.numel());
}

void CpuBackend::fill_zero(Tensor t) {
  if (t.numel() == 0) return;
  for (std::int64_t r = 0; r < t.rows; ++r) std::memset(f32(t) + r * t.row_stride, 0, sizeof(float) * t.cols);
}

void CpuBackend::copy(Tensor src, Tensor dst) {
  if (src.rows != dst.rows || src.cols != dst.cols)
    throw std::logic_error("cpu backend: copy shape mismatch");
  if (src.numel() == 0) return;
  for (std::int64_t r = 0; r < src.rows; ++r)
    std::memmove(f32(dst) + r * dst.row_stride, f32(src) + r * src.row_stride, sizeof(float) * src.cols);
  round_if_bf16(dst);
}

void CpuBackend::do_gemm(const GemmArgs& g) {
  const bool bias = !g.bias.empty();
  const float beta = g.accumulate ? 1.0f : 0.0f;
  // FP8 operands hold their FP8 values as floats; the product is dequantized by both factors.
  const float alpha = g.is_fp8() ? f32(g.a_scale_inv)[0] * f32(g.b_scale_inv)[0] : 1.0f;
  reference::gemm(g.transpose_a, g.transpose_b, g.m, g.n, g.k, alpha, f32(g.a), g.a.row_stride, f32(g.b),
                  g.b.row_stride, beta, f32(g.c), g.c.row_stride);
  if (bias) {
    for (std::int64_t r = 0; r < g.m; ++r) {
      float* row = f32(g.c) + r * g.c.row_stride;
      for (std::int64_t c = 0; c < g.n; ++c) row[c] += f32(g.bias)[c];
    }
  }
  round_if_bf16(g.c);
  if (!g.bias_grad.empty()) {  // column sums of dY stored (k, m)
    require_contiguous_cpu(g.a, "GEMM A with a bias gradient");
    reference::column_sum(f32(g.a), f32(g.bias_grad), g.k, g.m, /*accumulate=*/true);
  }
}

void CpuBackend::do_bias_grad(Tensor d_out, Tensor d_bias) {
  require_contiguous_cpu(d_out, "bias gradient input");
  reference::column_sum(f32(d_out), f32(d_bias), d_out.rows, d_out.cols, /*accumulate=*/true);
}

void CpuBackend::do_embedding_forward(Tensor tokens, Tensor table, Tensor position_table, std::int64_t seq,
                                      Tensor out) {
  reference::embedding_forward(i32(tokens), f32(table),
                               position_table.empty() ? nullptr : f32(position_table), f32(out), out.rows,
                               seq, table.rows, table.cols);
  round_if_bf16(out);
}

void CpuBackend::do_embedding_backward(Tensor tokens, Tensor d_out, std::int64_t seq, Tensor d_table,
                                       Tensor d_position_table) {
  reference::embedding_backward(i32(tokens), f32(d_out), f32(d_table),
                                d_position_table.empty() ? nullptr : f32(d_position_table), d_out.rows, seq,
                                d_table.rows, d_table.cols);
}

void CpuBackend::do_norm_forward(const NormArgs& a) {
  // With a residual, the sum is stored first (rounded to its dtype) and the norm taken of the stored sum, as
  // the CUDA kernel does and as a separate add followed by a norm would.
  const Tensor input = a.residual.empty() ? a.x : a.sum_out;
  if (!a.residual.empty()) {
    reference::add(f32(a.x), f32(a.residual), f32(a.sum_out), a.sum_out.numel());
    round_if_bf16(a.sum_out);
  }
  reference::norm_forward(a.kind, f32(input), nullptr, f32(a.gamma), a.beta.empty() ? nullptr : f32(a.beta),
                          f32(a.out), nullptr, a.mean.empty() ? nullptr : f32(a.mean), f32(a.rstd),
                          input.rows, input.cols, a.eps);
  round_if_bf16(a.out);
}

void CpuBackend::do_norm_backward(const NormArgs& a, Tensor d_out, Tensor d_residual, Tensor d_x,
                                  Tensor d_gamma, Tensor d_beta) {
  const Tensor input = a.residual.empty() ? a.x : a.sum_out;
  reference::norm_backward(
      a.kind, f32(d_out), f32(input), f32(a.gamma), a.mean.empty() ? nullptr : f32(a.mean), f32(a.rstd),
      d_residual.empty() ? nullptr : f32(d_residual), f32(d_x), f32(d_gamma),
      d_beta.empty() ? nullptr : f32(d_beta), input.rows, input.cols, /*accumulate=*/true);
  round_if_bf16(d_x);
}

void CpuBackend::do_rope(Tensor qkv, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                         std::int64_t head_dim, float theta, bool inverse, std::int64_t position_offset,
                         const RopeScaling& scaling) {
  AttentionShape s;
  s.batch = qkv.rows / seq;
  s.seq_q = seq;
  s.num_heads = heads;
  s.num_kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.q_token_stride = qkv.row_stride;
  s.k_token_stride = qkv.row_stride;
  float* q = f32(qkv);
  float* k = q + s.packed_k_offset();
  if (inverse) {
    reference::rope_backward_inplace(s, q, k, theta, position_offset, scaling);
  } else {
    reference::rope_forward_inplace(s, q, k, theta, position_offset, scaling);
  }
  round_if_bf16(qkv);
}

void CpuBackend::do_attention_forward(const AttentionArgs& a) {
  reference::attention_forward(attention_shape(a), f32(a.q), f32(a.k), f32(a.v), f32(a.out), f32(a.lse));
  round_if_bf16(a.out);
}

void CpuBackend::do_attention_backward(const AttentionArgs& a, const AttentionGrads& g) {
  reference::attention_backward(attention_shape(a, g), f32(a.q), f32(a.k), f32(a.v), f32(a.out), f32(a.lse),
                                f32(g.d_out), f32(g.dq), f32(g.dk), f32(g.dv));
  round_if_bf16(g.dq);
  round_if_bf16(g.dk);
  round_if_bf16(g.dv);
}

void CpuBackend::do_activation_forward(ActivationKind kind, Tensor in, Tensor out) {
  require_contiguous_cpu(in, "activation input");
  require_contiguous_cpu(out, "activation output");
  if (kind == ActivationKind::kGelu) {
    reference::bias_gelu_forward(f32(in), nullptr, nullptr, f32(out), in.rows, in.cols);
  } else {
    reference::swiglu_forward(f32(in), f32(out), in.rows, out.cols);
  }
  round_if_bf16(out);
}

void CpuBackend::do_activation_backward(ActivationKind kind, Tensor in, Tensor d_out, Tensor d_in) {
  if (kind == ActivationKind::kGelu) {
    reference::gelu_backward(f32(d_out), f32(in), f32(d_in), nullptr, in.rows, in.cols, false);
  } else {
    reference::swiglu_backward(f32(d_out), f32(in), f32(d_in), in.rows, d_out.cols);
  }
  round_if_bf16(d_in);
}

void CpuBackend::do_activation_backward_recompute(ActivationKind kind, Tensor in, Tensor d_out, Tensor d_in,
                                                  Tensor out) {
  for (const Tensor* t : {&in, &d_out, &d_in, &out}) require_contiguous_cpu(*t, "activation backward tensor");
  if (kind == ActivationKind::kGelu) {
    reference::gelu_backward_recompute(f32(d_out), f32(in), f32(d_in), f32(out), in.rows, in.cols);
  } else {
    reference::swiglu_backward_recompute(f32(d_out), f32(in), f32(d_in), f32(out), in.rows, d_out.cols);
  }
  round_if_bf16(d_in);
  round_if_bf16(out);
}

void CpuBackend::do_cross_entropy(Tensor logits, Tensor targets, Tensor losses, float grad_scale) {
  require_contiguous_cpu(logits, "logits");
  reference::cross_entropy(f32(logits), i32(targets), f32(losses), logits.rows, logits.cols,
                           /*write_gradient=*/true, grad_scale);
  round_if_bf16(logits);
}

void CpuBackend::do_cross_entropy_row_max(Tensor logits, Tensor row_max) {
  require_contiguous_cpu(logits, "logits");
  reference::cross_entropy_row_max(f32(logits), f32(row_max), logits.rows, logits.cols);
}

void CpuBackend::do_cross_entropy_target_sum_exp(Tensor logits, Tensor targets, std::int64_t vocab_offset,
                                                 const CrossEntropyStats& stats) {
  require_contiguous_cpu(logits, "logits");
  reference::cross_entropy_target_sum_exp(f32(logits), i32(targets), f32(stats.row_max),
                                          f32(stats.target_logit), f32(stats.sum_exp), logits.rows,
                                          logits.cols, vocab_offset);
}

void CpuBackend::do_cross_entropy_finish(Tensor logits, Tensor targets, std::int64_t vocab_offset,
                                         const CrossEntropyStats& stats, Tensor losses, float grad_scale) {
  require_contiguous_cpu(logits, "logits");
  reference::cross_entropy_finish(f32(logits), i32(targets), f32(stats.row_max), f32(stats.target_logit),
                                  f32(stats.sum_exp), f32(losses), logits.rows, logits.cols, vocab_offset,
                                  grad_scale);
  round_if_bf16(logits);
}

void CpuBackend::do_add(Tensor a, Tensor b, Tensor out) {
  require_contiguous_cpu(out, "add output");
  reference::add(f32(a), f32(b), f32(out), out.numel());
  round_if_bf16(out);
}

void CpuBackend::do_cast(Tensor src, Tensor dst) { copy(src, dst); }

void CpuBackend::do_fp8_cast(const Fp8CastArgs& a) {
  for (const Tensor* t : {&a.out, &a.out_transposed})
    if (!t->empty()) require_contiguous_cpu(*t, "FP8 cast output");
  const reference::Fp8CastParams params{a.encoding, a.current_scaling, a.margin, a.history_len, a.amax_max};
  reference::fp8_cast(f32(a.src), a.src.rows, a.src.cols, a.src.row_stride,
                      a.out.empty() ? nullptr : f32(a.out),
                      a.out_transposed.empty() ? nullptr : f32(a.out_transposed), f32(a.state), params,
                      a.bias_grad.empty() ? nullptr : f32(a.bias_grad));
}

void CpuBackend::do_attention_merge(const AttentionMergeArgs& a) {
  require_contiguous_cpu(a.block_out, "attention merge block output");
  AttentionMergeShape shape = a.shape;
  shape.out_stride = a.out.row_stride;
  reference::attention_merge(shape, f32(a.out), f32(a.lse), f32(a.block_out), f32(a.block_lse));
  round_if_bf16(a.out);
}

void CpuBackend::do_scale(Tensor t, float factor) {
  for (std::int64_t r = 0; r < t.rows; ++r)
    reference::scale_inplace(f32(t) + r * t.row_stride, t.cols, factor);
  round_if_bf16(t);
}

void CpuBackend::prepare_optimizer(std::vector<OptimizerTensor> tensors) {
  optimizer_tensors_ = std::move(tensors);
  optimizer_elements_ = 0;
  for (const OptimizerTensor& t : optimizer_tensors_) optimizer_elements_ += t.main_param.numel();
}

float CpuBackend::do_grad_norm() {
  std::vector<reference::GradTensor> grads;
  grads.reserve(optimizer_tensors_.size());
  for (const OptimizerTensor& t : optimizer_tensors_)
    if (t.in_grad_norm) grads.push_back({f32(t.main_grad), t.main_grad.numel()});
  last_grad_norm_ = reference::global_grad_norm(grads);
  return last_grad_norm_;
}

void CpuBackend::do_adamw_step(const AdamWHyper& hyper) {
  if (!std::isfinite(last_grad_norm_)) return;  // skipped iteration
  const float clip = adamw_clip_coefficient(last_grad_norm_, hyper.max_grad_norm);
  for (const OptimizerTensor& t : optimizer_tensors_) {
    const bool bf16_copy = emulate_bf16_ && t.model_param.dtype == DType::kBF16;
    AdamWHyper group = hyper;
    group.lr = hyper.lr_of(t.decoupled_lr);
    reference::adamw_step(f32(t.main_param), f32(t.main_grad), f32(t.exp_avg), f32(t.exp_avg_sq),
                          bf16_copy ? f32(t.model_param) : nullptr, t.main_param.numel(), group,
                          t.apply_weight_decay, clip);
    if (!bf16_copy && !t.model_param.empty() && t.model_param.data != t.main_param.data)
      copy(t.main_param, t.model_param);
  }
}

void CpuBackend::on_op_begin(const layouts::Op& op) {
  op_start_ = std::chrono::steady_clock::now();
  if (timed_.empty()) first_start_ = op_start_;
  timed_.push_back({op, 0.0, std::chrono::duration<double, std::milli>(op_start_ - first_start_).count()});
}

void CpuBackend::on_op_end() {
  timed_.back().ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - op_start_).count();
}

void CpuBackend::end_timed_op_now(std::size_t from_last) {
  if (!op_timing() || timed_.size() <= from_last) return;
  TimedOp& t = timed_[timed_.size() - 1 - from_last];
  const double now_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - first_start_).count();
  t.ms = std::max(t.ms, now_ms - t.start_ms);
}

std::vector<Backend::TimedOp> CpuBackend::timed_ops() {
  std::vector<TimedOp> out = std::move(timed_);
  timed_.clear();
  return out;
}

}  // namespace megatune::executor
