// The three GEMMs of a linear layer with weight (out, in) over m tokens (layouts/step_program.h's shapes):
// y = x . W^T (+ bias); dx = dy . W; dW (+)= dy^T . x into the fp32 grad buffer (+ the bias gradient).
#pragma once
#include <cstdint>

#include "executor/backend/backend.h"

namespace megatune::executor {

inline GemmArgs linear_forward_args(Tensor x, Tensor weight, Tensor y, Tensor bias, std::int64_t m) {
  GemmArgs g;
  g.a = x;
  g.b = weight;
  g.transpose_b = true;
  g.c = y;
  g.bias = bias;
  g.m = m;
  g.n = weight.rows;
  g.k = weight.cols;
  return g;
}

inline GemmArgs linear_data_grad_args(Tensor dy, Tensor weight, Tensor dx, std::int64_t m) {
  GemmArgs g;
  g.a = dy;
  g.b = weight;
  g.c = dx;
  g.m = m;
  g.n = weight.cols;
  g.k = weight.rows;
  return g;
}

inline GemmArgs linear_weight_grad_args(Tensor dy, Tensor x, Tensor weight, Tensor d_weight, Tensor d_bias,
                                        std::int64_t tokens) {
  GemmArgs g;
  g.a = dy;
  g.transpose_a = true;
  g.b = x;
  g.c = d_weight;
  g.bias_grad = d_bias;
  g.m = weight.rows;
  g.n = weight.cols;
  g.k = tokens;
  g.accumulate = true;
  return g;
}

}  // namespace megatune::executor
