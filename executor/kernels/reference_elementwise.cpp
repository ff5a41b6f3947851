// CPU reference element-wise helpers and bf16 rounding.
#include "executor/kernels/reference_elementwise.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace megatune::executor::reference {

float round_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if (std::isnan(x)) {
    bits = (bits | 0x00400000u) & 0xffff0000u;  // quiet NaN, keep sign
  } else {
    const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);  // ties to even
    bits = (bits + rounding_bias) & 0xffff0000u;
  }
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

void round_to_bf16_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
}

void add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void axpby(float alpha, const float* x, float beta, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = beta == 0.0f ? alpha * x[i] : alpha * x[i] + beta * out[i];
}

void column_sum(const float* x, float* sums, int64_t rows, int64_t cols, bool accumulate) {
  std::vector<double> acc(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) acc[c] += x[r * cols + c];
  for (int64_t c = 0; c < cols; ++c) sums[c] = float(accumulate ? sums[c] + acc[c] : acc[c]);
}

int64_t count_nonfinite(const float* x, int64_t n) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += std::isfinite(x[i]) ? 0 : 1;
  return count;
}

}  // namespace megatune::executor::reference
