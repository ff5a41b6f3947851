// CPU reference GEMMs (Eigen, float, row-major): the CPU backend's linear layers and the oracle for the
// cuBLASLt wrapper. Shapes follow nn.Linear: weight w [n, k] (out_features x in_features).
#pragma once
#include <cstdint>

namespace megatune::executor::reference {

// General row-major GEMM: C[m, n] = alpha * op(A)[m, k] . op(B)[k, n] + beta * C.
// op(A) = A stored [m, k] (lda >= k) or, with trans_a, A stored [k, m] (lda >= m); likewise B.
// beta == 0 never reads C (C may hold NaNs).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// y [m, n] = x [m, k] . w [n, k]^T (+ bias [n] when bias != nullptr).
void linear_forward(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
                    int64_t k);

// dx [m, k] = dy [m, n] . w [n, k]; with accumulate, dx += instead of =.
void linear_backward_data(const float* dy, const float* w, float* dx, int64_t m, int64_t n, int64_t k,
                          bool accumulate = false);

// dw [n, k] (+)= dy [m, n]^T . x [m, k]; dbias [n] (+)= sum over rows of dy when dbias != nullptr.
// accumulate = true is Megatron's gradient_accumulation_fusion (main_grad += ...).
void linear_backward_weight(const float* dy, const float* x, float* dw, float* dbias, int64_t m, int64_t n,
                            int64_t k, bool accumulate);

}  // namespace megatune::executor::reference
