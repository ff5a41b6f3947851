// CPU reference LayerNorm and RMSNorm, forward with optional fused residual add and backward, float.
// Rows are tokens, columns the hidden dimension; statistics in float (double accumulation on the CPU).
#pragma once
#include <cstdint>

#include "executor/kernels/norm_kind.h"

namespace megatune::executor::reference {

// sum = x + residual (when residual != nullptr; sum_out then receives it, may alias x), and
// y = (sum - mean) * rstd * gamma + beta   (LayerNorm; beta may be nullptr for no bias)
// y = sum * rstd * gamma                  (RMSNorm; mean is not computed, mean_out may be nullptr)
// x, residual, sum_out, y: [rows, hidden]; gamma, beta: [hidden]; mean_out, rstd_out: [rows] (saved for
// backward). rstd = 1 / sqrt(var + eps) (LayerNorm: biased variance; RMSNorm: mean of squares).
void norm_forward(NormKind kind, const float* x, const float* residual, const float* gamma, const float* beta,
                  float* y, float* sum_out, float* mean_out, float* rstd_out, int64_t rows, int64_t hidden,
                  float eps);

// Backward of norm_forward given dy [rows, hidden] and the norm's input (the sum when a residual was fused).
// dx [rows, hidden] = d(norm)/d(input) . dy  (+ d_residual [rows, hidden] when not nullptr: the gradient
// that flows along the residual stream, added here so the engine needs no extra pass).
// dgamma, dbeta [hidden]: overwritten, or added to with accumulate; dbeta may be nullptr (RMSNorm/no bias).
void norm_backward(NormKind kind, const float* dy, const float* input, const float* gamma, const float* mean,
                   const float* rstd, const float* d_residual, float* dx, float* dgamma, float* dbeta,
                   int64_t rows, int64_t hidden, bool accumulate);

}  // namespace megatune::executor::reference
