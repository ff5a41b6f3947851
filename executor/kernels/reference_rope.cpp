// CPU reference RoPE (rotate-half) on the q and k heads, in place.
#include "executor/kernels/reference_rope.h"

#include <cmath>
#include <stdexcept>
#include <vector>

namespace megatune::executor::reference {
namespace {

void rotate_heads(float* base, int64_t token_stride, int64_t heads, const AttentionShape& shape, float theta,
                  int64_t position_offset, float direction, const RopeScaling& scaling) {
  const int64_t d = shape.head_dim, half = d / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = rope_inv_freq(i, d, theta, scaling);
  const float m = scaling.concentration;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t s = 0; s < shape.seq_q; ++s) {
      const float position = float(position_offset + s);
      for (int64_t h = 0; h < heads; ++h) {
        float* x = base + (b * shape.seq_q + s) * token_stride + h * d;
        for (int64_t i = 0; i < half; ++i) {
          const float angle = position * inv_freq[i];
          const float c = m * std::cos(angle), sn = m * direction * std::sin(angle);
          const float x1 = x[i], x2 = x[i + half];
          x[i] = x1 * c - x2 * sn;
          x[i + half] = x2 * c + x1 * sn;
        }
      }
    }
  }
}

void check(const AttentionShape& shape) {
  validate_attention_shape(shape);
  if (shape.head_dim % 2 != 0) throw std::invalid_argument("rope: head_dim must be even");
}

}  // namespace

void rope_forward_inplace(const AttentionShape& shape, float* q, float* k, float theta,
                          int64_t position_offset, const RopeScaling& scaling) {
  check(shape);
  rotate_heads(q, shape.q_stride(), shape.num_heads, shape, theta, position_offset, 1.0f, scaling);
  rotate_heads(k, shape.k_stride(), shape.num_kv_heads, shape, theta, position_offset, 1.0f, scaling);
}

void rope_backward_inplace(const AttentionShape& shape, float* dq, float* dk, float theta,
                           int64_t position_offset, const RopeScaling& scaling) {
  check(shape);
  rotate_heads(dq, shape.q_stride(), shape.num_heads, shape, theta, position_offset, -1.0f, scaling);
  rotate_heads(dk, shape.k_stride(), shape.num_kv_heads, shape, theta, position_offset, -1.0f, scaling);
}

}  // namespace megatune::executor::reference
