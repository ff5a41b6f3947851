// CPU reference softmax cross-entropy with the in-place logits gradient.
#include "executor/kernels/reference_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace megatune::executor::reference {

void cross_entropy(float* logits, const int32_t* targets, float* loss, int64_t tokens, int64_t vocab,
                   bool write_gradient, float grad_scale) {
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = logits + t * vocab;
    const int32_t target = targets[t];
    if (target >= vocab)
      throw std::out_of_range("cross_entropy: target " + std::to_string(target) + " of token " +
                              std::to_string(t) + " outside the vocabulary of " + std::to_string(vocab));
    if (target < 0) {
      loss[t] = 0.0f;
      if (write_gradient) std::fill_n(row, vocab, 0.0f);
      continue;
    }
    const float max_logit = *std::max_element(row, row + vocab);
    double sum_exp = 0;
    for (int64_t v = 0; v < vocab; ++v) sum_exp += std::exp(double(row[v]) - max_logit);
    const double lse = max_logit + std::log(sum_exp);
    loss[t] = float(lse - row[target]);
    if (write_gradient) {
      for (int64_t v = 0; v < vocab; ++v) {
        const double softmax = std::exp(double(row[v]) - lse);
        row[v] = float((softmax - (v == target ? 1.0 : 0.0)) * grad_scale);
      }
    }
  }
}

}  // namespace megatune::executor::reference
