// RoPE in place on the q and k heads of packed qkv (or separate q/k) in bf16, rotate-half convention, angles
// in fp32; backward = inverse rotation of dq/dk. Same math as reference_rope.h.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "executor/kernels/attention_shape.h"
#include "executor/kernels/rope_scaling.h"

namespace megatune::executor::cuda {

using bf16 = __nv_bfloat16;

// q with shape.q_stride(), k with shape.k_stride(); head_dim even. theta: 10000 or 500000 (Llama 3).
// scaling: YaRN's frequencies and cos/sin factor (rope_scaling.h); the default is plain RoPE.
void rope_forward_inplace(const AttentionShape& shape, bf16* q, bf16* k, float theta, int64_t position_offset,
                          cudaStream_t stream, const RopeScaling& scaling = {});
void rope_backward_inplace(const AttentionShape& shape, bf16* dq, bf16* dk, float theta,
                           int64_t position_offset, cudaStream_t stream, const RopeScaling& scaling = {});

}  // namespace megatune::executor::cuda
