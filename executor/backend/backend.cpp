// Backend: op recording around each kernel (kind, shape, and bytes counted in the logical dtype as
// layouts/step_program.h counts them), the arena, then dispatch to the implementation.
#include "executor/backend/backend.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "executor/kernels/reference_moe.h"
#include "layouts/context_parallel.h"

namespace megatune::executor {

AttentionShape attention_shape(const AttentionArgs& a) {
  AttentionShape s;
  s.batch = a.batch;
  s.seq_q = a.seq_q;
  s.seq_kv = a.seq_kv;
  s.num_heads = a.heads;
  s.num_kv_heads = a.kv_heads;
  s.head_dim = a.head_dim;
  s.head_dim_v = a.head_dim_v;
  s.causal = a.causal;
  s.causal_offset = a.causal_offset;
  s.softmax_scale = a.softmax_scale;
  s.q_token_stride = a.q.row_stride;
  s.k_token_stride = a.k.row_stride;
  s.v_token_stride = a.v.row_stride;
  s.o_token_stride = a.out.row_stride;
  return s;
}

AttentionShape attention_shape(const AttentionArgs& a, const AttentionGrads& g) {
  if (g.d_out.row_stride != a.out.row_stride)
    throw std::logic_error("attention backward: d_out must share the output's row stride");
  AttentionShape s = attention_shape(a);
  s.dq_token_stride = g.dq.row_stride;
  s.dk_token_stride = g.dk.row_stride;
  s.dv_token_stride = g.dv.row_stride;
  return s;
}

AttentionArgs self_attention_args(Tensor qkv, Tensor out, Tensor lse, std::int64_t batch, std::int64_t seq,
                                  std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                                  std::int64_t storage_bytes) {
  AttentionArgs a;
  a.q = columns_of(qkv, 0, heads * head_dim, storage_bytes);
  a.k = columns_of(qkv, heads * head_dim, kv_heads * head_dim, storage_bytes);
  a.v = columns_of(qkv, (heads + kv_heads) * head_dim, kv_heads * head_dim, storage_bytes);
  a.out = out;
  a.lse = lse;
  a.batch = batch;
  a.seq_q = a.seq_kv = seq;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.head_dim = a.head_dim_v = head_dim;
  a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  return a;
}

AttentionGrads packed_attention_grads(Tensor d_out, Tensor d_qkv, const AttentionArgs& a,
                                      std::int64_t storage_bytes) {
  const std::int64_t q_cols = a.heads * a.head_dim, k_cols = a.kv_heads * a.head_dim;
  return {d_out, columns_of(d_qkv, 0, q_cols, storage_bytes),
          columns_of(d_qkv, q_cols, k_cols, storage_bytes),
          columns_of(d_qkv, q_cols + k_cols, a.kv_heads * a.head_dim_v, storage_bytes)};
}

namespace {

using layouts::Op;
using layouts::OpKind;

std::int64_t element_bytes(const Tensor& t) { return t.is_int32 ? 4 : layouts::dtype_bytes(t.dtype); }

// Calls f(first row, run) for every run of every sequence of `seq` rows in `rows`.
template <typename F>
void for_each_run(std::int64_t rows, std::int64_t seq, const SequencePositions& positions, F f) {
  for (std::int64_t first = 0; first < rows; first += seq)
    for (const PositionRun& run : positions) f(first + run.local_begin, run);
}

Op memory_op(OpKind kind, DType dtype, std::int64_t bytes) {
  Op op;
  op.kind = kind;
  op.dtype = dtype;
  op.bytes = bytes;
  return op;
}

}  // namespace

void Backend::begin_external_op(layouts::Op op, const OpTag& tag, int microbatch, int chunk) {
  begin_op(std::move(op), tag, microbatch, chunk);
}

void Backend::begin_op(layouts::Op op, const OpTag& tag, int microbatch, int chunk) {
  if (!recorder_.enabled() && !op_timing_ && op_observer_ == nullptr) return;
  recorder_.stamp(op, tag);
  if (microbatch >= -1) op.microbatch = microbatch;
  if (chunk >= -1) op.chunk = chunk;
  if (op_observer_ != nullptr) op_observer_->op_begin(observed_ops_++, op);
  if (op_timing_) on_op_begin(op);
  if (recorder_.enabled()) recorder_.append(std::move(op));
}

Tensor Backend::row_slice(Tensor t, std::int64_t first, std::int64_t rows) const {
  const std::int64_t bytes = t.is_int32 ? 4 : storage_bytes(t.dtype);
  if (t.data != nullptr) t.data = static_cast<char*>(t.data) + first * t.row_stride * bytes;
  t.rows = rows;
  return t;
}

void Backend::end_op() {
  if (op_timing_) on_op_end();
  if (op_observer_ != nullptr) op_observer_->op_end();
}

void Backend::begin_sizing() {
  sizing_ = true;
  sized_bytes_ = 0;
  breakdown_.clear();
}

std::int64_t Backend::end_sizing() {
  sizing_ = false;
  return sized_bytes_;
}

void Backend::reserve_arena(std::int64_t bytes) {
  if (arena_base_ != nullptr) throw std::logic_error("backend arena reserved twice");
  arena_base_ = static_cast<char*>(reserve_memory(bytes));
  arena_capacity_ = bytes;
  arena_used_ = 0;
  breakdown_.clear();
}

void Backend::account(const char* what, std::int64_t bytes, int allocations) {
  auto use =
      std::find_if(breakdown_.begin(), breakdown_.end(), [&](const ArenaUse& u) { return u.what == what; });
  if (use == breakdown_.end()) use = breakdown_.insert(breakdown_.end(), ArenaUse{what, 0, 0});
  use->bytes += bytes;
  use->allocations += allocations;
}

Tensor Backend::bump(std::int64_t bytes, std::int64_t rows, std::int64_t cols, const char* what) {
  const std::int64_t aligned = (bytes + kArenaAlignBytes - 1) / kArenaAlignBytes * kArenaAlignBytes;
  Tensor t;
  t.rows = rows;
  t.cols = cols;
  t.row_stride = cols;
  account(what, aligned, 1);
  if (sizing_) {
    sized_bytes_ += aligned;
    return t;
  }
  if (arena_used_ + aligned > arena_capacity_) {
    throw std::runtime_error(std::string("backend arena exhausted allocating ") + what + " (" +
                             std::to_string(bytes) + " bytes; " +
                             std::to_string(arena_capacity_ - arena_used_) + " of " +
                             std::to_string(arena_capacity_) + " left)");
  }
  t.data = arena_base_ + arena_used_;
  arena_used_ += aligned;
  return t;
}

Tensor Backend::allocate_block(DType dtype, std::int64_t rows, std::int64_t cols, const char* what) {
  Tensor t;
  t.rows = rows;
  t.cols = cols;
  t.row_stride = cols;
  t.dtype = dtype;
  const std::int64_t bytes = storage_bytes(dtype) * rows * cols;
  account(what, bytes, 1);
  if (sizing_) return t;
  t.data = reserve_block(bytes);
  block_bytes_ += bytes;
  fill_zero(t);
  return t;
}

void Backend::release_block(Tensor block, const char* what) {
  const std::int64_t bytes = storage_bytes(block.dtype) * block.rows * block.cols;
  account(what, -bytes, -1);
  if (block.data == nullptr) return;
  synchronize();  // no kernel or transfer still reads or writes it
  free_block(block.data);
  block_bytes_ -= bytes;
}

Tensor Backend::allocate(DType dtype, std::int64_t rows, std::int64_t cols, const char* what) {
  Tensor t = bump(storage_bytes(dtype) * rows * cols, rows, cols, what);
  t.dtype = dtype;
  if (!sizing_) fill_zero(t);
  return t;
}

Tensor Backend::allocate_int32(std::int64_t rows, std::int64_t cols, const char* what) {
  Tensor t = bump(4 * rows * cols, rows, cols, what);
  t.is_int32 = true;
  if (!sizing_) fill_zero(t);
  return t;
}

void Backend::gemm(const GemmArgs& args, const OpTag& tag) {
  if (!args.bias_grad.empty() && (!args.transpose_a || args.bias_grad.numel() != args.m))
    throw std::logic_error("gemm: bias_grad needs transpose_a (dW = dY^T . X) and m elements");
  if (args.is_fp8() && (args.b.dtype != DType::kFP8 || args.transpose_a || !args.transpose_b ||
                        args.a_scale_inv.empty() || args.b_scale_inv.empty() || !args.bias_grad.empty()))
    throw std::logic_error("gemm: FP8 operands are both FP8, stored (m, k) and (n, k), with their scales");
  Op op;
  op.kind = OpKind::kGemm;
  op.dtype = args.a.dtype;
  op.m = args.m;
  op.n = args.n;
  op.k = args.k;
  op.accumulate = args.accumulate;
  begin_op(std::move(op), tag);
  do_gemm(args);
  end_op();
}

void Backend::grouped_gemm(const std::vector<GemmArgs>& gemms, const OpTag& tag) {
  if (gemms.empty()) throw std::logic_error("grouped_gemm: no GEMMs");
  const GemmArgs& first = gemms.front();
  Op op;
  op.kind = OpKind::kGemm;
  op.dtype = first.a.dtype;
  op.m = first.transpose_a ? first.m : 0;
  op.n = first.n;
  op.k = first.transpose_a ? 0 : first.k;
  op.accumulate = first.accumulate;
  for (const GemmArgs& g : gemms) {
    const bool same = g.transpose_a == first.transpose_a && g.n == first.n &&
                      g.accumulate == first.accumulate && (g.transpose_a ? g.m == first.m : g.k == first.k);
    if (!same || !g.bias_grad.empty() || !g.bias.empty())
      throw std::logic_error("grouped_gemm: the GEMMs of a group share their shape but the summed dimension");
    (first.transpose_a ? op.k : op.m) += first.transpose_a ? g.k : g.m;
  }
  begin_op(std::move(op), tag);
  do_grouped_gemm(gemms);
  end_op();
}

void Backend::linear_gelu_forward(const GemmArgs& args, Tensor out, const OpTag& tag) {
  if (!args.bias_grad.empty() || args.accumulate || out.rows != args.m || out.cols != args.n)
    throw std::logic_error("linear_gelu_forward: out must be (m, n); no accumulate or bias gradient");
  Op op;
  op.kind = OpKind::kGemm;
  op.dtype = args.a.dtype;
  op.m = args.m;
  op.n = args.n;
  op.k = args.k;
  begin_op(std::move(op), tag);
  do_linear_gelu_forward(args, out);
  end_op();
}

void Backend::do_linear_gelu_forward(const GemmArgs& args, Tensor out) {
  do_gemm(args);
  do_activation_forward(ActivationKind::kGelu, args.c, out);
}

void Backend::bias_grad(Tensor d_out, Tensor d_bias, const OpTag& tag) {
  begin_op(memory_op(OpKind::kElementwise, d_out.dtype,
                     d_out.numel() * element_bytes(d_out) + 2 * d_bias.numel() * 4),
           tag);
  do_bias_grad(d_out, d_bias);
  end_op();
}

void Backend::embedding_forward(Tensor tokens, Tensor table, Tensor position_table, std::int64_t seq,
                                Tensor out, const OpTag& tag, const SequencePositions& positions) {
  // Bytes as the step program counts them: the rows written plus the ids read (int64 in Megatron).
  begin_op(memory_op(OpKind::kEmbedding, out.dtype, out.numel() * element_bytes(out) + tokens.numel() * 8),
           tag);
  if (position_table.empty() || positions.empty()) {
    do_embedding_forward(tokens, table, position_table, seq, out);
  } else {
    for_each_run(tokens.rows, seq, positions, [&](std::int64_t row, const PositionRun& run) {
      do_embedding_forward(row_slice(tokens, row, run.length), table,
                           row_slice(position_table, run.global_begin, run.length), run.length,
                           row_slice(out, row, run.length));
    });
  }
  end_op();
}

void Backend::embedding_backward(Tensor tokens, Tensor d_out, std::int64_t seq, Tensor d_table,
                                 Tensor d_position_table, const OpTag& tag,
                                 const SequencePositions& positions) {
  begin_op(memory_op(OpKind::kEmbeddingBackward, d_out.dtype,
                     d_out.numel() * (element_bytes(d_out) + 4) + tokens.numel() * 8),
           tag);
  if (d_position_table.empty() || positions.empty()) {
    do_embedding_backward(tokens, d_out, seq, d_table, d_position_table);
  } else {
    for_each_run(tokens.rows, seq, positions, [&](std::int64_t row, const PositionRun& run) {
      do_embedding_backward(row_slice(tokens, row, run.length), row_slice(d_out, row, run.length), run.length,
                            d_table, row_slice(d_position_table, run.global_begin, run.length));
    });
  }
  end_op();
}

void Backend::norm_forward(const NormArgs& args, const OpTag& tag) {
  // x read, y written; with a fused residual also the residual read and the sum written.
  const std::int64_t tensors = args.residual.empty() ? 2 : 4;
  begin_op(memory_op(OpKind::kNorm, args.x.dtype, tensors * args.x.numel() * element_bytes(args.x)), tag);
  do_norm_forward(args);
  end_op();
}

void Backend::norm_backward(const NormArgs& args, Tensor d_out, Tensor d_residual, Tensor d_x, Tensor d_gamma,
                            Tensor d_beta, const OpTag& tag) {
  begin_op(memory_op(OpKind::kNormBackward, args.x.dtype, 3 * args.x.numel() * element_bytes(args.x)), tag);
  do_norm_backward(args, d_out, d_residual, d_x, d_gamma, d_beta);
  end_op();
}

void Backend::rope(Tensor qkv, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                   std::int64_t head_dim, float theta, bool inverse, const OpTag& tag,
                   const SequencePositions& positions, const RopeScaling& scaling) {
  begin_op(memory_op(inverse ? OpKind::kRopeBackward : OpKind::kRope, qkv.dtype,
                     2 * qkv.rows * (heads + kv_heads) * head_dim * element_bytes(qkv)),
           tag);
  if (positions.empty()) {
    do_rope(qkv, seq, heads, kv_heads, head_dim, theta, inverse, 0, scaling);
  } else {
    for_each_run(qkv.rows, seq, positions, [&](std::int64_t row, const PositionRun& run) {
      do_rope(row_slice(qkv, row, run.length), run.length, heads, kv_heads, head_dim, theta, inverse,
              run.global_begin, scaling);
    });
  }
  end_op();
}

namespace {
Op attention_op(OpKind kind, const AttentionArgs& a) {
  Op op;
  op.kind = kind;
  op.dtype = a.q.dtype;
  op.attention.batch = a.batch;
  op.attention.heads = a.heads;
  op.attention.kv_heads = a.kv_heads;
  op.attention.seq_q = a.seq_q;
  op.attention.seq_kv = a.seq_kv;
  op.attention.head_dim = a.head_dim;
  op.attention.head_dim_v = a.head_dim_v;
  op.attention.causal = a.causal;
  return op;
}
}  // namespace

void Backend::attention_forward(const AttentionArgs& args, const OpTag& tag) {
  begin_op(attention_op(OpKind::kAttentionForward, args), tag);
  do_attention_forward(args);
  end_op();
}

void Backend::attention_backward(const AttentionArgs& args, const AttentionGrads& grads, const OpTag& tag) {
  begin_op(attention_op(OpKind::kAttentionBackward, args), tag);
  do_attention_backward(args, grads);
  end_op();
}

void Backend::activation_forward(ActivationKind kind, Tensor in, Tensor out, const OpTag& tag) {
  begin_op(memory_op(OpKind::kActivation, in.dtype, (in.numel() + out.numel()) * element_bytes(in)), tag);
  do_activation_forward(kind, in, out);
  end_op();
}

void Backend::activation_backward(ActivationKind kind, Tensor in, Tensor d_out, Tensor d_in,
                                  const OpTag& tag) {
  begin_op(
      memory_op(OpKind::kActivationBackward, in.dtype, (2 * in.numel() + d_out.numel()) * element_bytes(in)),
      tag);
  do_activation_backward(kind, in, d_out, d_in);
  end_op();
}

void Backend::activation_backward_recompute(ActivationKind kind, Tensor in, Tensor d_out, Tensor d_in,
                                            Tensor out, const OpTag& tag) {
  if (d_in.rows != in.rows || d_in.cols != in.cols || out.rows != d_out.rows || out.cols != d_out.cols)
    throw std::logic_error("activation_backward_recompute: d_in must be shaped as in, out as d_out");
  begin_op(memory_op(OpKind::kActivationBackward, in.dtype,
                     (in.numel() + d_out.numel() + d_in.numel() + out.numel()) * element_bytes(in)),
           tag);
  do_activation_backward_recompute(kind, in, d_out, d_in, out);
  end_op();
}

void Backend::cross_entropy(Tensor logits, Tensor targets, Tensor losses, float grad_scale,
                            const OpTag& tag) {
  begin_op(memory_op(OpKind::kCrossEntropy, logits.dtype, 2 * logits.numel() * element_bytes(logits)), tag);
  do_cross_entropy(logits, targets, losses, grad_scale);
  end_op();
}

void Backend::vocab_parallel_cross_entropy(Tensor logits, Tensor targets, std::int64_t vocab_offset,
                                           Tensor losses, float grad_scale, const CrossEntropyStats& stats,
                                           const StatsReduce& reduce, const OpTag& tag) {
  begin_op(memory_op(OpKind::kCrossEntropy, logits.dtype, 2 * logits.numel() * element_bytes(logits)), tag);
  do_cross_entropy_row_max(logits, stats.row_max);
  end_op();
  reduce(stats.row_max, true, "ce_max_ar");
  do_cross_entropy_target_sum_exp(logits, targets, vocab_offset, stats);
  reduce(stats.target_logit, false, "ce_target_ar");
  reduce(stats.sum_exp, false, "ce_sum_exp_ar");
  do_cross_entropy_finish(logits, targets, vocab_offset, stats, losses, grad_scale);
}

void Backend::moe_permute(Tensor x, const MoePermutation& plan, Tensor out, const OpTag& tag) {
  begin_op(memory_op(OpKind::kRouter, out.dtype, 2 * out.numel() * element_bytes(out)), tag);
  do_moe_permute(x, plan, out);
  end_op();
}

void Backend::moe_unpermute(Tensor rows, const MoePermutation& plan, bool weighted, Tensor out,
                            const OpTag& tag) {
  begin_op(memory_op(OpKind::kRouter, out.dtype, (rows.numel() + out.numel()) * element_bytes(out)), tag);
  do_moe_unpermute(rows, plan, weighted, out);
  end_op();
}

void Backend::moe_unpermute_backward(Tensor d_out, Tensor rows, const MoePermutation& plan, Tensor d_rows,
                                     std::vector<float>& d_probs, const OpTag& tag) {
  begin_op(memory_op(OpKind::kRouter, d_out.dtype,
                     (d_out.numel() + rows.numel() + d_rows.numel()) * element_bytes(d_out)),
           tag);
  do_moe_unpermute_backward(d_out, rows, plan, d_rows, d_probs);
  for (const auto& [first, n] : plan.pad_runs)
    if (n > 0) fill_zero(row_slice(d_rows, first, n));
  end_op();
}

namespace {
std::vector<float> host_copy(Backend& backend, Tensor t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  backend.download(t, out.data());
  return out;
}
}  // namespace

void Backend::do_moe_permute(Tensor x, const MoePermutation& plan, Tensor out) {
  const std::vector<float> input = host_copy(*this, x);
  std::vector<float> result(static_cast<std::size_t>(out.numel()));
  reference::moe_permute(input.data(), plan.row_token.data(), plan.rows(), x.cols, result.data());
  upload(out, result.data());
}

void Backend::do_moe_unpermute(Tensor rows, const MoePermutation& plan, bool weighted, Tensor out) {
  const std::vector<float> input = host_copy(*this, rows);
  std::vector<float> result(static_cast<std::size_t>(out.numel()));
  reference::moe_unpermute(input.data(), plan.token_rows.data(), weighted ? plan.token_probs.data() : nullptr,
                           plan.tokens, plan.topk, out.cols, result.data());
  upload(out, result.data());
}

void Backend::do_moe_unpermute_backward(Tensor d_out, Tensor rows, const MoePermutation& plan, Tensor d_rows,
                                        std::vector<float>& d_probs) {
  const std::vector<float> dy = host_copy(*this, d_out), input = host_copy(*this, rows);
  std::vector<float> d_input(static_cast<std::size_t>(d_rows.numel()), 0.0f);
  d_probs.assign(static_cast<std::size_t>(plan.tokens * plan.topk), 0.0f);
  reference::moe_unpermute_backward(dy.data(), input.data(), plan.token_rows.data(), plan.token_probs.data(),
                                    plan.tokens, plan.topk, d_out.cols, d_input.data(), d_probs.data());
  upload(d_rows, d_input.data());
}

void Backend::add(Tensor a, Tensor b, Tensor out, const OpTag& tag) {
  begin_op(memory_op(OpKind::kElementwise, out.dtype, 3 * out.numel() * element_bytes(out)), tag);
  do_add(a, b, out);
  end_op();
}

void Backend::add_rows(Tensor dst, Tensor src, std::int64_t seq, std::int64_t first, const OpTag& tag) {
  const std::int64_t sequences = seq > 0 ? dst.rows / seq : 0;
  if (sequences == 0 || dst.rows % seq != 0 || src.rows % sequences != 0 || first < 0 ||
      first + src.rows / sequences > seq || src.cols != dst.cols)
    throw std::logic_error("add_rows: the source rows do not fit the target's sequences");
  const std::int64_t n = src.rows / sequences;
  begin_op(memory_op(OpKind::kElementwise, dst.dtype, 3 * src.numel() * element_bytes(src)), tag);
  for (std::int64_t s = 0; s < sequences; ++s) {
    const Tensor target = row_slice(dst, s * seq + first, n);
    do_add(target, row_slice(src, s * n, n), target);
  }
  end_op();
}

void Backend::attention_merge(const AttentionMergeArgs& args, const OpTag& tag) {
  const AttentionMergeShape& s = args.shape;
  begin_op(memory_op(OpKind::kElementwise, args.out.dtype,
                     layouts::attention_merge_bytes(s.batch * s.queries, s.heads, s.head_dim,
                                                    element_bytes(args.out))),
           tag);
  do_attention_merge(args);
  end_op();
}

void Backend::scale(Tensor t, float factor, const OpTag& tag) {
  begin_op(memory_op(OpKind::kElementwise, t.dtype, 2 * t.numel() * element_bytes(t)), tag);
  do_scale(t, factor);
  end_op();
}

float Backend::grad_norm(const OpTag& tag) {
  begin_op(memory_op(OpKind::kGradNorm, DType::kFP32, 4 * optimizer_elements_), tag);
  const auto result = do_grad_norm();
  end_op();
  return result;
}

void Backend::adamw_step(const AdamWHyper& hyper, const OpTag& tag) {
  begin_op(memory_op(OpKind::kOptimizer, DType::kFP32, 30 * optimizer_elements_), tag);
  do_adamw_step(hyper);
  end_op();
}

void Backend::fp8_cast(const Fp8CastArgs& args, const OpTag& tag) {
  const Tensor& src = args.src;
  const int outputs = (args.out.empty() ? 0 : 1) + (args.out_transposed.empty() ? 0 : 1);
  const bool shapes = (args.out.empty() || (args.out.rows == src.rows && args.out.cols == src.cols)) &&
                      (args.out_transposed.empty() ||
                       (args.out_transposed.rows == src.cols && args.out_transposed.cols == src.rows));
  if (outputs == 0 || !shapes || args.state.empty() ||
      (!args.bias_grad.empty() && args.bias_grad.numel() != src.cols))
    throw std::logic_error(
        "fp8_cast: an output of src's shape (or transposed), a state, a bias gradient of "
        "src's columns");
  begin_op(memory_op(OpKind::kElementwise, DType::kFP8,
                     layouts::fp8_cast_bytes(src.numel(), outputs, args.current_scaling)),
           tag);
  do_fp8_cast(args);
  end_op();
}

void Backend::cast(Tensor src, Tensor dst, const OpTag& tag) {
  begin_op(
      memory_op(OpKind::kElementwise, dst.dtype, src.numel() * (element_bytes(src) + element_bytes(dst))),
      tag);
  do_cast(src, dst);
  end_op();
}

}  // namespace megatune::executor
