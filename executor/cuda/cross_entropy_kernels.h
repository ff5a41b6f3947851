// Fused softmax cross-entropy over a large vocabulary from bf16 logits: one pass for max / sum-exp / target
// logit (fp32, online), loss per token, and the gradient written in place over the bf16 logits; fp32 logits
// are never materialized. Same math as reference_cross_entropy.h.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace megatune::executor::cuda {

using bf16 = __nv_bfloat16;

// logits [tokens, vocab] bf16 (vocab a multiple of 8), targets [tokens] int32 (negative = ignored), loss
// [tokens] fp32. With write_gradient, logits[t] <- (softmax - onehot(target)) * grad_scale (0 for ignored
// rows). grad_scale = loss scale / number of counted tokens for a mean loss.
void cross_entropy_forward_backward(bf16* logits, const int32_t* targets, float* loss, int64_t tokens,
                                    int64_t vocab, bool write_gradient, float grad_scale,
                                    cudaStream_t stream);

// Vocab-parallel cross entropy in three passes (reference_cross_entropy.h has the math): logits are this
// rank's vocabulary slice starting at global id vocab_offset; targets are global ids; the statistics are
// reduced over the tensor-parallel group between the passes.
void cross_entropy_row_max(const bf16* logits, float* row_max, int64_t tokens, int64_t vocab,
                           cudaStream_t stream);
void cross_entropy_target_sum_exp(const bf16* logits, const int32_t* targets, const float* row_max,
                                  float* target_logit, float* sum_exp, int64_t tokens, int64_t vocab,
                                  int64_t vocab_offset, cudaStream_t stream);
void cross_entropy_finish(bf16* logits, const int32_t* targets, const float* row_max,
                          const float* target_logit, const float* sum_exp, float* loss, int64_t tokens,
                          int64_t vocab, int64_t vocab_offset, float grad_scale, cudaStream_t stream);

}  // namespace megatune::executor::cuda
