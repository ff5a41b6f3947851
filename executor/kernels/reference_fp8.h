// CPU reference of FP8 casts (layouts/fp8.h, Fp8CastArgs in executor/backend/backend.h): the CPU backend's
// emulation of Transformer Engine's FP8 recipes and the oracle of the CUDA cast kernels. Values are floats
// holding FP8 values (each exactly representable in its encoding).
#pragma once
#include <cstdint>

#include "layouts/fp8.h"

namespace megatune::executor::reference {

struct Fp8CastParams {
  layouts::Fp8Encoding encoding = layouts::Fp8Encoding::kE4M3;
  bool current_scaling = true;
  int margin = 0;
  int history_len = 1;
  bool amax_max = false;
};

// Largest |x| of src [rows, cols] (row stride ld); NaN when any value is NaN.
float fp8_amax(const float* src, std::int64_t rows, std::int64_t cols, std::int64_t ld);

// The scaling state before a cast of a tensor whose amax is `amax` (state: layouts::Fp8StateField layout).
// Current scaling: the scale from amax. Delayed: a pending amax rolled into the history (newest first), the
// scale from the history's maximum (amax_max) or newest entry, kept when that is 0 or not finite; nothing
// pending afterwards.
void fp8_prepare_scale(float* state, float amax, const Fp8CastParams& params);
// After a delayed cast: its amax recorded as pending.
void fp8_record_amax(float* state, float amax);

// The whole cast: prepare, then out [rows, cols] (row stride cols) and / or out_t [cols, rows] =
// round_to_fp8(src * scale) (either may be null), then (delayed) record; bias_grad [cols] += column sums of
// src when not null.
void fp8_cast(const float* src, std::int64_t rows, std::int64_t cols, std::int64_t ld, float* out,
              float* out_t, float* state, const Fp8CastParams& params, float* bias_grad);

}  // namespace megatune::executor::reference
