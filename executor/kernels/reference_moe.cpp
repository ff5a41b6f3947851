// CPU reference MoE permutation, combine and the combine's backward.
#include "executor/kernels/reference_moe.h"

#include <algorithm>

namespace megatune::executor::reference {

void moe_permute(const float* x, const std::int32_t* row_token, std::int64_t rows, std::int64_t hidden,
                 float* out) {
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy(x + row_token[r] * hidden, x + (row_token[r] + 1) * hidden, out + r * hidden);
}

void moe_unpermute(const float* rows, const std::int32_t* token_rows, const float* token_probs,
                   std::int64_t tokens, int topk, std::int64_t hidden, float* out) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    float* y = out + t * hidden;
    std::fill(y, y + hidden, 0.0f);
    for (int j = 0; j < topk; ++j) {
      const std::int32_t r = token_rows[t * topk + j];
      if (r < 0) continue;
      const float w = token_probs == nullptr ? 1.0f : token_probs[t * topk + j];
      const float* src = rows + r * hidden;
      for (std::int64_t i = 0; i < hidden; ++i) y[i] += w * src[i];
    }
  }
}

void moe_unpermute_backward(const float* d_out, const float* rows, const std::int32_t* token_rows,
                            const float* token_probs, std::int64_t tokens, int topk, std::int64_t hidden,
                            float* d_rows, float* d_probs) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    const float* dy = d_out + t * hidden;
    for (int j = 0; j < topk; ++j) {
      const std::int32_t r = token_rows[t * topk + j];
      if (r < 0) {
        d_probs[t * topk + j] = 0.0f;
        continue;
      }
      const float w = token_probs[t * topk + j];
      const float* src = rows + r * hidden;
      double dot = 0.0;
      for (std::int64_t i = 0; i < hidden; ++i) {
        d_rows[r * hidden + i] = w * dy[i];
        dot += static_cast<double>(dy[i]) * src[i];
      }
      d_probs[t * topk + j] = static_cast<float>(dot);
    }
  }
}

}  // namespace megatune::executor::reference
