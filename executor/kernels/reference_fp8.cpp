// CPU reference of FP8 casts: scaling state, rounding, transposed copies.
#include "executor/kernels/reference_fp8.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace megatune::executor::reference {

using layouts::kFp8History;
using layouts::kFp8Pending;
using layouts::kFp8PendingAmax;
using layouts::kFp8Scale;
using layouts::kFp8ScaleInv;

float fp8_amax(const float* src, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  float amax = 0.0f;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const float v = std::fabs(src[r * ld + c]);
      if (std::isnan(v)) return std::numeric_limits<float>::quiet_NaN();
      amax = std::max(amax, v);
    }
  return amax;
}

void fp8_prepare_scale(float* state, float amax, const Fp8CastParams& params) {
  if (params.current_scaling) {
    state[kFp8Scale] = layouts::fp8_scale_for_amax(amax, params.encoding, params.margin);
    state[kFp8ScaleInv] = 1.0f / state[kFp8Scale];
    state[kFp8PendingAmax] = amax;
    state[kFp8Pending] = 0.0f;
    return;
  }
  if (state[kFp8Pending] == 0.0f) return;
  float* history = state + kFp8History;
  const int length = std::max(params.history_len, 1);
  for (int i = length - 1; i > 0; --i) history[i] = history[i - 1];
  history[0] = state[kFp8PendingAmax];
  float chosen = history[0];
  if (params.amax_max)
    for (int i = 1; i < length; ++i) chosen = std::max(chosen, history[i]);
  if (chosen > 0.0f && std::isfinite(chosen)) {
    state[kFp8Scale] = layouts::fp8_scale_for_amax(chosen, params.encoding, params.margin);
    state[kFp8ScaleInv] = 1.0f / state[kFp8Scale];
  }
  state[kFp8PendingAmax] = 0.0f;
  state[kFp8Pending] = 0.0f;
}

void fp8_record_amax(float* state, float amax) {
  state[kFp8PendingAmax] = amax;
  state[kFp8Pending] = 1.0f;
}

void fp8_cast(const float* src, std::int64_t rows, std::int64_t cols, std::int64_t ld, float* out,
              float* out_t, float* state, const Fp8CastParams& params, float* bias_grad) {
  const float amax = fp8_amax(src, rows, cols, ld);
  fp8_prepare_scale(state, amax, params);
  const float scale = state[kFp8Scale];
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const float q = layouts::round_to_fp8(src[r * ld + c] * scale, params.encoding);
      if (out != nullptr) out[r * cols + c] = q;
      if (out_t != nullptr) out_t[c * rows + r] = q;
    }
  if (!params.current_scaling) fp8_record_amax(state, amax);
  if (bias_grad != nullptr)
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) bias_grad[c] += src[r * ld + c];
}

}  // namespace megatune::executor::reference
