// GPTModel: the LM head and cross entropy (chunked; vocab-parallel under TP), the loss backward, and the
// losses of the micro-batches.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "base/user_error.h"
#include "executor/model/gpt_model.h"
#include "executor/model/gpt_model_phases.h"

namespace megatune::executor {
namespace {

using namespace gpt_model_phases;  // NOLINT(google-build-using-namespace)

}  // namespace

void GPTModel::loss_forward(const MicroBatch& mb, int index, int slot, bool with_gradients) {
  const std::int64_t T = shape_.tokens;
  Slot& s = slots_[slot];
  std::vector<std::int32_t> targets(T);
  double counted = 0.0;
  for (std::int64_t t = 0; t < T; ++t) {
    const bool counts = mb.loss_mask[t] != 0.0f;
    targets[t] = counts ? mb.labels[t] : -1;
    counted += counts ? 1.0 : 0.0;
  }
  counted_tokens_[index] = counted;
  backend_.upload_int32(targets_, targets.data());
  // Mean over the counted tokens of the micro-batch, averaged over the iteration's micro-batches.
  const float grad_scale =
      counted > 0
          ? static_cast<float>(1.0 / (counted * batch_.num_microbatches * batch_.gradient_average_ranks))
          : 0.0f;
  // With MTP the last decoder layer's stage applied the final norm (its output ends the residual stream).
  Tensor hidden = s.residual.back();
  if (config_.mtp_num_layers == 0) {
    const auto [fn_w, fn_b] = norm_weights(model_params_, "decoder.final_layernorm");
    backend_.norm_forward(
        norm_args(s.residual.back(), {}, {}, fn_w, fn_b, s.final_norm, s.final_mean, s.final_rstd),
        {"final_norm", -1, kF});
    hidden = s.final_norm;
  }
  head_and_loss(*head_, hidden, targets_, rows_of(losses_, index, 1, 4), grad_scale, s.head_grad,
                with_gradients, -1);
}

void GPTModel::head_and_loss(const TensorParallelLinear& head, Tensor hidden, Tensor targets,
                             Tensor losses_row, float grad_scale, Tensor head_grad, bool with_gradients,
                             int layer) {
  const std::int64_t T = shape_.tokens;
  const Tensor final_full = head.gather_input(hidden, full_scratch_, kF);
  // LM head and loss per token chunk (layouts::loss_chunk_rows): logits, cross entropy (losses, and the
  // logits' gradient in place; vocab-parallel under TP), then the head's data gradient (into head_grad,
  // read by the backward's final norm) and weight gradient, so one chunk of logits is held at a time.
  const std::int64_t storage = backend_.storage_bytes(compute_dtype_);
  const std::int64_t vocab_offset = tp_rank_ * shape_.vocab_per_rank();
  for (std::int64_t first = 0; first < T; first += loss_chunk_rows_) {
    const std::int64_t rows = std::min(loss_chunk_rows_, T - first);
    const Tensor logits = carve(logits_, 0, rows, logits_.cols, storage);
    const Tensor chunk_hidden = rows_of(final_full, first, rows, storage);
    head.forward_gemm(chunk_hidden, logits, kF);
    Tensor losses = losses_row;
    losses.data = losses.data == nullptr ? nullptr : static_cast<float*>(losses.data) + first;
    losses.cols = rows;
    const Tensor chunk_targets = rows_of(targets, first, rows, 4);
    if (tp_size_ == 1) {
      backend_.cross_entropy(logits, chunk_targets, losses, grad_scale, {"cross_entropy", layer, kF});
    } else {
      Backend::CrossEntropyStats stats;
      stats.row_max = carve(ce_stats_.row_max, 0, rows, 1, 4);
      stats.target_logit = carve(ce_stats_.target_logit, 0, rows, 1, 4);
      stats.sum_exp = carve(ce_stats_.sum_exp, 0, rows, 1, 4);
      auto reduce = [&](Tensor t, bool is_max, const char* label) {
        communicator_.all_reduce(CommGroup::kTensor, t, is_max ? ReduceOp::kMax : ReduceOp::kSum,
                                 {label, layer, kF, kTpRole});
      };
      backend_.vocab_parallel_cross_entropy(logits, chunk_targets, vocab_offset, losses, grad_scale, stats,
                                            reduce, {"cross_entropy", layer, kF});
    }
    if (!with_gradients) continue;
    head.data_grad(logits, rows_of(head_grad, first, rows, storage));
    head.weight_grad(logits, chunk_hidden, head_grad_written_);
    head_grad_written_ = true;
  }
}

void GPTModel::loss_backward(int slot) {
  // The slot's head_grad holds the gradient of the final norm's output (the LM head's data gradient, from
  // forward()), partial over the vocabulary slices under TP.
  Slot& s = slots_[slot];
  if (config_.mtp_num_layers > 0) {  // the final norm's backward follows the MTP layers'
    head_->reduce_input_grad(s.head_grad, mtp_->main_head_grad);
    return;
  }
  const Tensor d_final = head_->reduce_input_grad(s.head_grad, d_hidden_shard_);
  Tensor fn_b, d_fn_b;
  if (config_.norm == NormKind::kLayerNorm) {
    fn_b = view(model_params_, layout_.find("decoder.final_layernorm.bias"));
    d_fn_b = view(grads_, layout_.find("decoder.final_layernorm.bias"));
  }
  const ParameterEntry& fn_w = layout_.find("decoder.final_layernorm.weight");
  backend_.norm_backward(norm_args(s.residual.back(), {}, {}, view(model_params_, fn_w), fn_b, s.final_norm,
                                   s.final_mean, s.final_rstd),
                         d_final, {}, d_res_, view(grads_, fn_w), d_fn_b, {"final_norm", -1, kB});
}

std::vector<double> GPTModel::microbatch_losses() {
  std::vector<double> out(batch_.num_microbatches, 0.0);
  if (!stage_.has_loss) return out;
  std::vector<float> host(losses_.numel());
  backend_.download(losses_, host.data());
  const std::int64_t T = shape_.tokens;
  for (int i = 0; i < batch_.num_microbatches; ++i) {
    double sum = 0.0;
    for (std::int64_t t = 0; t < T; ++t) sum += host[i * T + t];
    out[i] = counted_tokens_[i] > 0 ? sum / counted_tokens_[i] : 0.0;
  }
  return out;
}

double GPTModel::evaluate(const MicroBatch& mb) {
  if (!stage_.has_embedding || !stage_.has_loss)
    throw std::logic_error("evaluate: the model must hold the embedding and the loss (one pipeline stage)");
  forward_only(mb, 0);
  return microbatch_losses()[0];
}

}  // namespace megatune::executor
