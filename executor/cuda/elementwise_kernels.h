// Element-wise and small reduction kernels: fp32 <-> bf16 casts, add / axpby / scale, deterministic column
// sums (bias gradients) and sums (loss), and the NaN/inf count.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace megatune::executor::cuda {

using bf16 = __nv_bfloat16;

void cast_fp32_to_bf16(const float* x, bf16* y, int64_t n, cudaStream_t stream);  // round to nearest even
void cast_bf16_to_fp32(const bf16* x, float* y, int64_t n, cudaStream_t stream);
// out = a + b (bf16, fp32 math; out may alias a or b).
void add_bf16(const bf16* a, const bf16* b, bf16* out, int64_t n, cudaStream_t stream);
// out = alpha * x + beta * out (fp32; beta == 0 never reads out).
void axpby_fp32(float alpha, const float* x, float beta, float* out, int64_t n, cudaStream_t stream);
void scale_fp32_inplace(float* x, int64_t n, float scale, cudaStream_t stream);

// sums [cols] fp32 (+)= column sums of x [rows, cols] bf16; deterministic two-stage reduction.
size_t column_sum_workspace_bytes(int64_t rows, int64_t cols);
void column_sum_bf16(const bf16* x, float* sums, int64_t rows, int64_t cols, bool accumulate, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream);

// *sum_device = sum of x [n] (fp32, one block, fixed order: deterministic).
void sum_fp32(const float* x, int64_t n, float* sum_device, cudaStream_t stream);

// *count_device += number of NaN/inf elements (integer atomics: exact).
void count_nonfinite_fp32(const float* x, int64_t n, int* count_device, cudaStream_t stream);
void count_nonfinite_bf16(const bf16* x, int64_t n, int* count_device, cudaStream_t stream);

}  // namespace megatune::executor::cuda
