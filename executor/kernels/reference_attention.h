// CPU reference attention (naive softmax(q k^T * scale) v; causal with an offset or not; GQA; seq_q !=
// seq_kv; a v head dim of its own) and its backward, with the log-sum-exp; float over the layout of
// attention_shape.h. Memory O(seq_kv) per (batch, head) row.
#pragma once
#include "executor/kernels/attention_shape.h"

namespace megatune::executor::reference {

// o [b, seq_q, n_q, d_v] (o_stride()) and lse [b, n_q, seq_q] (natural log) from q, k, v laid out as
// attention_shape.h says. A query attending no key gets o = 0 and lse = -inf.
void attention_forward(const AttentionShape& shape, const float* q, const float* k, const float* v, float* o,
                       float* lse);

// Gradients from d_o (o_stride()), o and lse: dq (dq_stride()), dk (dk_stride()) and dv (dv_stride(); dk and
// dv summed over the heads of each query group). o and lse may be those of several key blocks merged (see
// attention_shape.h): the gradients are then this block's share, and a caller sums the blocks' shares.
// dq, dk, dv are overwritten (only the head slices they own: a packed dqkv buffer gets all three).
void attention_backward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                        const float* o, const float* lse, const float* d_o, float* dq, float* dk, float* dv);

}  // namespace megatune::executor::reference
