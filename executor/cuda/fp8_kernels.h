// FP8 casts on the GPU (layouts/fp8.h; reference: executor/kernels/reference_fp8.h): the scaling state's
// update and one pass that writes a bf16 tensor's FP8 copy and / or its transpose.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace megatune::executor::cuda {

struct Fp8CastLaunch {
  const __nv_bfloat16* src = nullptr;  // [rows, cols], row stride ld
  std::int64_t rows = 0, cols = 0, ld = 0;
  std::uint8_t* out = nullptr;    // [rows, cols] or null
  std::uint8_t* out_t = nullptr;  // [cols, rows] or null
  float* state = nullptr;         // layouts::Fp8StateField layout
  bool e5m2 = false;
  bool current_scaling = true;
  int margin = 0;
  int history_len = 1;
  bool amax_max = false;
};

// Current scaling: src's amax (a reduction), then the cast with the scale from it (each block derives it;
// the first writes the state). Delayed: the state's update (one thread: the pending amax rolled into the
// history, the scale from it), then the cast, which records its amax as pending. Values saturate at the
// encoding's largest finite value, rounded to nearest even, as reference::fp8_cast.
void fp8_cast(const Fp8CastLaunch& launch, cudaStream_t stream);

}  // namespace megatune::executor::cuda
