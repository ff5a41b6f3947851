// CPU reference fused softmax cross-entropy over the vocabulary: loss per token and the logits gradient
// written in place over the logits.
#pragma once
#include <cstdint>

namespace megatune::executor::reference {

// logits [tokens, vocab]; targets [tokens] (negative = ignored: loss 0, gradient 0).
// loss[t] = logsumexp(logits[t]) - logits[t, target].
// With write_gradient, logits[t] is replaced by (softmax(logits[t]) - onehot(target)) * grad_scale
// (grad_scale = loss scale / number of counted tokens for a mean loss). Ignored rows become 0.
// Targets >= vocab throw std::out_of_range.
void cross_entropy(float* logits, const int32_t* targets, float* loss, int64_t tokens, int64_t vocab,
                   bool write_gradient, float grad_scale);

// Vocab-parallel cross entropy (Megatron's), in three passes with reductions over the tensor-parallel group
// between them. logits [tokens, vocab] is this rank's slice of the vocabulary, starting at global id
// vocab_offset; targets are global ids (negative = ignored).
// Pass 1: row_max[t] = max of the row (then reduced with max).
void cross_entropy_row_max(const float* logits, float* row_max, int64_t tokens, int64_t vocab);
// Pass 2, given the reduced maxima: target_logit[t] = the target's logit when this slice holds it, else 0;
// sum_exp[t] = sum of exp(logit - row_max[t]) over the slice (both then reduced with sum).
void cross_entropy_target_sum_exp(const float* logits, const int32_t* targets, const float* row_max,
                                  float* target_logit, float* sum_exp, int64_t tokens, int64_t vocab,
                                  int64_t vocab_offset);
// Pass 3, given the reduced statistics: loss[t] = log(sum_exp) + row_max - target_logit, and the logits
// replaced by (softmax - onehot(target)) * grad_scale; ignored rows get loss 0 and gradient 0.
void cross_entropy_finish(float* logits, const int32_t* targets, const float* row_max,
                          const float* target_logit, const float* sum_exp, float* loss, int64_t tokens,
                          int64_t vocab, int64_t vocab_offset, float grad_scale);

}  // namespace megatune::executor::reference
