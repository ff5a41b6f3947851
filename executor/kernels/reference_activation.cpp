// CPU reference GELU (tanh approximation) and SwiGLU, forward and backward.
#include "executor/kernels/reference_activation.h"

#include <cmath>
#include <vector>

namespace megatune::executor::reference {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float silu_derivative(float x) {
  const float sigmoid = 1.0f / (1.0f + std::exp(-x));
  return sigmoid * (1.0f + x * (1.0f - sigmoid));
}

}  // namespace

float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
}

float gelu_tanh_derivative(float x) {
  const float inner = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float t = std::tanh(inner);
  const float d_inner = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * d_inner;
}

void bias_gelu_forward(const float* x, const float* bias, float* pre_out, float* y, int64_t rows,
                       int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float pre = x[r * cols + c] + (bias != nullptr ? bias[c] : 0.0f);
      if (pre_out != nullptr) pre_out[r * cols + c] = pre;
      y[r * cols + c] = gelu_tanh(pre);
    }
}

void gelu_backward(const float* dy, const float* pre, float* dx, float* dbias, int64_t rows, int64_t cols,
                   bool accumulate_dbias) {
  std::vector<double> bias_acc(dbias != nullptr ? size_t(cols) : 0, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float g = dy[r * cols + c] * gelu_tanh_derivative(pre[r * cols + c]);
      dx[r * cols + c] = g;
      if (dbias != nullptr) bias_acc[c] += g;
    }
  if (dbias != nullptr)
    for (int64_t c = 0; c < cols; ++c)
      dbias[c] = float(accumulate_dbias ? dbias[c] + bias_acc[c] : bias_acc[c]);
}

void swiglu_forward(const float* x, float* y, int64_t rows, int64_t f) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < f; ++c) y[r * f + c] = silu(x[r * 2 * f + c]) * x[r * 2 * f + f + c];
}

void swiglu_backward(const float* dy, const float* x, float* dx, int64_t rows, int64_t f) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < f; ++c) {
      const float gate = x[r * 2 * f + c], up = x[r * 2 * f + f + c], g = dy[r * f + c];
      dx[r * 2 * f + c] = g * up * silu_derivative(gate);
      dx[r * 2 * f + f + c] = g * silu(gate);
    }
}

void gelu_backward_recompute(const float* dy, const float* pre, float* dx, float* y, int64_t rows,
                             int64_t cols) {
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float p = pre[i], g = dy[i];
    dx[i] = g * gelu_tanh_derivative(p);
    y[i] = gelu_tanh(p);
  }
}

void swiglu_backward_recompute(const float* dy, const float* x, float* dx, float* y, int64_t rows,
                               int64_t f) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < f; ++c) {
      const float gate = x[r * 2 * f + c], up = x[r * 2 * f + f + c], g = dy[r * f + c];
      dx[r * 2 * f + c] = g * up * silu_derivative(gate);
      dx[r * 2 * f + f + c] = g * silu(gate);
      y[r * f + c] = silu(gate) * up;
    }
}

}  // namespace megatune::executor::reference
