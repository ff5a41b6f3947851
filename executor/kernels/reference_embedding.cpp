// CPU reference embedding lookup and its scatter-add backward.
#include "executor/kernels/reference_embedding.h"

#include <stdexcept>
#include <string>

namespace megatune::executor::reference {
namespace {

// Negative ids are tokens of another rank's vocabulary slice (vocab-parallel embedding): a zero row, no
// gradient.
void check_id(int32_t id, int64_t vocab, int64_t t) {
  if (id >= vocab)
    throw std::out_of_range("embedding: token " + std::to_string(t) + " has id " + std::to_string(id) +
                            " outside the vocabulary [0, " + std::to_string(vocab) + ")");
}

}  // namespace

void embedding_forward(const int32_t* ids, const float* word, const float* position, float* out,
                       int64_t tokens, int64_t seq_len, int64_t vocab, int64_t hidden) {
  for (int64_t t = 0; t < tokens; ++t) {
    check_id(ids[t], vocab, t);
    const float* w = ids[t] >= 0 ? word + int64_t(ids[t]) * hidden : nullptr;
    const float* p = position != nullptr ? position + (t % seq_len) * hidden : nullptr;
    for (int64_t c = 0; c < hidden; ++c)
      out[t * hidden + c] = (w != nullptr ? w[c] : 0.0f) + (p != nullptr ? p[c] : 0.0f);
  }
}

void embedding_backward(const int32_t* ids, const float* d_out, float* d_word, float* d_position,
                        int64_t tokens, int64_t seq_len, int64_t vocab, int64_t hidden) {
  for (int64_t t = 0; t < tokens; ++t) {
    check_id(ids[t], vocab, t);
    if (ids[t] >= 0) {
      float* w = d_word + int64_t(ids[t]) * hidden;
      for (int64_t c = 0; c < hidden; ++c) w[c] += d_out[t * hidden + c];
    }
    if (d_position != nullptr) {
      float* p = d_position + (t % seq_len) * hidden;
      for (int64_t c = 0; c < hidden; ++c) p[c] += d_out[t * hidden + c];
    }
  }
}

}  // namespace megatune::executor::reference
