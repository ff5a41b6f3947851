// GEMMs with a tiny inner dimension (an MoE router's data gradient: dx (T, h) += d_logits (T, E) . W (E, h),
// E = 8-64), which cuBLASLt runs at a few TFLOP/s (0.53 ms for T 8192, h 2048, E 8 on an H200, against
// ~0.03 ms for the bytes): a memory-bound kernel, fp32 accumulation in k order.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace megatune::executor::cuda {

using bf16 = __nv_bfloat16;

constexpr int64_t kSmallGemmMaxK = 64;

// Whether small_k_gemm takes the shape: 1 <= k <= kSmallGemmMaxK, n and the row strides multiples of 8,
// the pointers 16-byte aligned.
bool small_k_gemm_supports(int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, const void* a,
                           const void* b, const void* c);

// C (m, n) = A (m, k) . B (k, n) [+ C when accumulate]; row-major bf16 with row strides lda, ldb, ldc.
void small_k_gemm(const bf16* a, int64_t lda, const bf16* b, int64_t ldb, bf16* c, int64_t ldc, int64_t m,
                  int64_t n, int64_t k, bool accumulate, cudaStream_t stream);

}  // namespace megatune::executor::cuda
