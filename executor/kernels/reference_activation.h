// CPU reference activations: GELU (tanh approximation, as Megatron's bias_gelu fusion and cuBLASLt's GELU
// epilogue), SwiGLU, bias add/bias-GELU, and their backward passes; float.
#pragma once
#include <cstdint>

namespace megatune::executor::reference {

// gelu(x) = 0.5 x (1 + tanh(0.7978845608 (x + 0.044715 x^3))), and its exact derivative.
float gelu_tanh(float x);
float gelu_tanh_derivative(float x);

// pre [rows, cols] = x + bias (bias [cols], may be nullptr); y = gelu(pre). pre_out may be nullptr (then
// it is not stored); y may alias x.
void bias_gelu_forward(const float* x, const float* bias, float* pre_out, float* y, int64_t rows,
                       int64_t cols);

// dx [rows, cols] = dy * gelu'(pre); dbias [cols] (+)= column sums of dx when dbias != nullptr.
void gelu_backward(const float* dy, const float* pre, float* dx, float* dbias, int64_t rows, int64_t cols,
                   bool accumulate_dbias);

// SwiGLU (Megatron's: x = [gate | up] along the last dimension): x [rows, 2f] -> y [rows, f] = silu(gate) *
// up.
void swiglu_forward(const float* x, float* y, int64_t rows, int64_t f);

// dx [rows, 2f]: d_gate = dy * up * silu'(gate), d_up = dy * silu(gate).
void swiglu_backward(const float* dy, const float* x, float* dx, int64_t rows, int64_t f);

// Backward passes that also recompute the activation output (for the next layer's weight gradient), element
// by element, so that dx may alias x and y may alias dy: GELU: dx = dy * gelu'(pre), y = gelu(pre) (all
// [rows, cols]); SwiGLU: dx [rows, 2f] as swiglu_backward, y [rows, f] = silu(gate) * up.
void gelu_backward_recompute(const float* dy, const float* pre, float* dx, float* y, int64_t rows,
                             int64_t cols);
void swiglu_backward_recompute(const float* dy, const float* x, float* dx, float* y, int64_t rows, int64_t f);

}  // namespace megatune::executor::reference
