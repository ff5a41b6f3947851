// CPU reference rotary position embedding (RoPE), Megatron/Llama "rotate half" convention, applied in place
// to the q and k heads of a packed qkv tensor (layout of attention_shape.h); backward is the inverse
// rotation.
#pragma once
#include <cstdint>

#include "executor/kernels/attention_shape.h"
#include "executor/kernels/rope_scaling.h"

namespace megatune::executor::reference {

// Rotation angle for position p and pair i (0 <= i < d/2): p * theta^(-2i/d), computed in float as
// float(p) * inv_freq[i] with inv_freq[i] = 1 / theta^(2i/d) (what Megatron's RotaryEmbedding does).
// For x1 = x[i], x2 = x[i + d/2]:  x[i] = x1 cos - x2 sin,  x[i + d/2] = x2 cos + x1 sin.
// Positions are position_offset + 0 .. s-1 within each sequence. Only q and k heads are touched; v is not.
// theta: 10000 (Llama 2, GPT-NeoX) or 500000 (Llama 3). scaling: YaRN's inverse frequencies
// (rope_inv_freq) and cos and sin multiplied by its concentration factor; the default is plain RoPE.
void rope_forward_inplace(const AttentionShape& shape, float* q, float* k, float theta,
                          int64_t position_offset = 0, const RopeScaling& scaling = {});

// Backward: rotates dq and dk by the negative angle (the rotation is orthogonal; the concentration factor
// multiplies both ways), in place.
void rope_backward_inplace(const AttentionShape& shape, float* dq, float* dk, float theta,
                           int64_t position_offset = 0, const RopeScaling& scaling = {});

}  // namespace megatune::executor::reference
