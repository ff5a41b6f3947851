// CPU reference attention (naive softmax(q k^T * scale) v, causal or not, GQA) and its backward, with the
// log-sum-exp; float over the layout of attention_shape.h. Memory O(s) per (batch, head) row.
#pragma once
#include "executor/kernels/attention_shape.h"

namespace megatune::executor::reference {

// o [b, s, n_q, d] (token stride shape.o_stride()) and lse [b, n_q, s] (natural log) from q, k, v laid out
// as attention_shape.h says (q with q_stride(), k and v with kv_stride(); for packed qkv pass
// q = qkv, k = qkv + packed_k_offset(), v = qkv + packed_v_offset()).
void attention_forward(const AttentionShape& shape, const float* q, const float* k, const float* v, float* o,
                       float* lse);

// Gradients from d_o [b, s, n_q, d] (o_stride()), o and lse of the forward: dq (q_stride()), dk and dv
// (kv_stride(), summed over the heads of each query group). dq, dk, dv are overwritten (only the head
// slices they own: a packed dqkv buffer gets all three).
void attention_backward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                        const float* o, const float* lse, const float* d_o, float* dq, float* dk, float* dv);

}  // namespace megatune::executor::reference
