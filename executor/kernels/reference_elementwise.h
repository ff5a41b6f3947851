// CPU reference element-wise helpers: bf16 rounding (round-to-nearest-even, as __float2bfloat16), add,
// scale, bias-gradient column sums and the non-finite check.
#pragma once
#include <cstdint>

namespace megatune::executor::reference {

// float -> nearest bf16 (ties to even; NaN stays NaN) -> float.
float round_to_bf16(float x);
void round_to_bf16_inplace(float* x, int64_t n);

// out[i] = a[i] + b[i] (out may alias a or b).
void add(const float* a, const float* b, float* out, int64_t n);

// out[i] = alpha * x[i] + beta * out[i]  (beta == 0 never reads out).
void axpby(float alpha, const float* x, float beta, float* out, int64_t n);

// sums [cols] (+)= column sums of x [rows, cols] (bias gradients).
void column_sum(const float* x, float* sums, int64_t rows, int64_t cols, bool accumulate);

// Number of NaN or +-inf elements.
int64_t count_nonfinite(const float* x, int64_t n);

}  // namespace megatune::executor::reference
