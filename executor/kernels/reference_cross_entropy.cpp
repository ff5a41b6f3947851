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

void cross_entropy_row_max(const float* logits, float* row_max, int64_t tokens, int64_t vocab) {
  for (int64_t t = 0; t < tokens; ++t)
    row_max[t] = *std::max_element(logits + t * vocab, logits + (t + 1) * vocab);
}

namespace {
// The target's column in this slice, or -1 when another rank's slice (or nobody: ignored) holds it.
int64_t local_target(int32_t target, int64_t vocab, int64_t vocab_offset) {
  const int64_t local = int64_t(target) - vocab_offset;
  return target >= 0 && local >= 0 && local < vocab ? local : -1;
}
}  // namespace

void cross_entropy_target_sum_exp(const float* logits, const int32_t* targets, const float* row_max,
                                  float* target_logit, float* sum_exp, int64_t tokens, int64_t vocab,
                                  int64_t vocab_offset) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = logits + t * vocab;
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - row_max[t]);
    sum_exp[t] = float(sum);
    const int64_t local = local_target(targets[t], vocab, vocab_offset);
    target_logit[t] = local >= 0 ? row[local] : 0.0f;
  }
}

void cross_entropy_finish(float* logits, const int32_t* targets, const float* row_max,
                          const float* target_logit, const float* sum_exp, float* loss, int64_t tokens,
                          int64_t vocab, int64_t vocab_offset, float grad_scale) {
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = logits + t * vocab;
    if (targets[t] < 0) {
      loss[t] = 0.0f;
      std::fill_n(row, vocab, 0.0f);
      continue;
    }
    const double lse = double(row_max[t]) + std::log(double(sum_exp[t]));
    loss[t] = float(lse - target_logit[t]);
    const int64_t local = local_target(targets[t], vocab, vocab_offset);
    for (int64_t v = 0; v < vocab; ++v) {
      const double softmax = std::exp(double(row[v]) - lse);
      row[v] = float((softmax - (v == local ? 1.0 : 0.0)) * grad_scale);
    }
  }
}

}  // namespace megatune::executor::reference
