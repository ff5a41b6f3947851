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

}  // namespace megatune::executor::reference
