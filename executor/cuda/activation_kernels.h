// Activation kernels in bf16 with fp32 math: bias+GELU (tanh approximation, Megatron's bias_gelu fusion) and
// SwiGLU, forward and backward. Same math as reference_activation.h.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace megatune::executor::cuda {

using bf16 = __nv_bfloat16;

// pre_out [rows, cols] = x + bias (bias [cols] may be null; pre_out may be null), y = gelu_tanh(x + bias).
void bias_gelu_forward(const bf16* x, const bf16* bias, bf16* pre_out, bf16* y, int64_t rows, int64_t cols,
                       cudaStream_t stream);
// dx = dy * gelu_tanh'(pre) (dx may alias dy). Bias gradients: column_sum_bf16 (elementwise_kernels.h).
void gelu_backward(const bf16* dy, const bf16* pre, bf16* dx, int64_t rows, int64_t cols,
                   cudaStream_t stream);
// x [rows, 2f] = [gate | up] -> y [rows, f] = silu(gate) * up.
void swiglu_forward(const bf16* x, bf16* y, int64_t rows, int64_t f, cudaStream_t stream);
// dx [rows, 2f] = [dy * up * silu'(gate) | dy * silu(gate)].
void swiglu_backward(const bf16* dy, const bf16* x, bf16* dx, int64_t rows, int64_t f, cudaStream_t stream);

// Backward passes that also recompute the activation output (one pass; element-wise in place: dx may alias
// the input, y may alias dy). GELU: dx = dy * gelu'(pre), y = gelu(pre) [rows, cols]. SwiGLU: dx [rows, 2f]
// as swiglu_backward, y [rows, f] = silu(gate) * up.
void gelu_backward_recompute(const bf16* dy, const bf16* pre, bf16* dx, bf16* y, int64_t rows, int64_t cols,
                             cudaStream_t stream);
void swiglu_backward_recompute(const bf16* dy, const bf16* x, bf16* dx, bf16* y, int64_t rows, int64_t f,
                               cudaStream_t stream);

}  // namespace megatune::executor::cuda
