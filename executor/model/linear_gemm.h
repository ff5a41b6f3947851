// The GEMM arguments of a linear layer (weight (out, in), layouts/step_program.h's shapes) and row views of
// activation buffers, shared by the model's dense and MoE blocks.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "executor/backend/backend.h"

namespace megatune::executor {

// The three GEMMs of a linear layer with weight (out, in) over m tokens (layouts/step_program.h's shapes):
// y = x . W^T (+ bias); dx = dy . W; dW (+)= dy^T . x into the fp32 grad buffer (+ the bias gradient).
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

inline Tensor rows_of(Tensor t, std::int64_t first_row, std::int64_t rows, std::int64_t storage_bytes) {
  Tensor v = t;
  v.data = static_cast<char*>(t.data) + first_row * t.row_stride * storage_bytes;
  v.rows = rows;
  return v;
}

// A (rows, cols) contiguous view `offset` elements into a flat buffer (null data stays null: sizing mode).
inline Tensor carve(Tensor buffer, std::int64_t offset, std::int64_t rows, std::int64_t cols,
                    std::int64_t storage_bytes) {
  if (offset + rows * cols > buffer.numel()) throw std::logic_error("carve: view exceeds its buffer");
  Tensor v = buffer;
  if (buffer.data != nullptr) v.data = static_cast<char*>(buffer.data) + offset * storage_bytes;
  v.rows = rows;
  v.cols = cols;
  v.row_stride = cols;
  return v;
}

}  // namespace megatune::executor
