// CPU reference GEMMs over Eigen maps of row-major float matrices.
#include "executor/kernels/reference_gemm.h"

#include <Eigen/Core>
#include <stdexcept>

namespace megatune::executor::reference {
namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMajor, 0, Eigen::OuterStride<>>;
using Map = Eigen::Map<RowMajor, 0, Eigen::OuterStride<>>;

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m < 0 || n < 0 || k < 0) throw std::invalid_argument("reference::gemm: negative dimension");
  if (ldc < n || lda < (trans_a ? m : k) || ldb < (trans_b ? k : n))
    throw std::invalid_argument("reference::gemm: leading dimension smaller than the row length");
  Map c_map(c, m, n, Eigen::OuterStride<>(ldc));
  if (m == 0 || n == 0) return;
  ConstMap a_map(a, trans_a ? k : m, trans_a ? m : k, Eigen::OuterStride<>(lda));
  ConstMap b_map(b, trans_b ? n : k, trans_b ? k : n, Eigen::OuterStride<>(ldb));
  RowMajor product(m, n);
  if (trans_a && trans_b) {
    product.noalias() = a_map.transpose() * b_map.transpose();
  } else if (trans_a) {
    product.noalias() = a_map.transpose() * b_map;
  } else if (trans_b) {
    product.noalias() = a_map * b_map.transpose();
  } else {
    product.noalias() = a_map * b_map;
  }
  if (beta == 0.0f) {
    c_map = alpha * product;
  } else {
    c_map = alpha * product + beta * c_map;
  }
}

void linear_forward(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
                    int64_t k) {
  gemm(false, true, m, n, k, 1.0f, x, k, w, k, 0.0f, y, n);
  if (bias != nullptr) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) y[i * n + j] += bias[j];
  }
}

void linear_backward_data(const float* dy, const float* w, float* dx, int64_t m, int64_t n, int64_t k,
                          bool accumulate) {
  gemm(false, false, m, k, n, 1.0f, dy, n, w, k, accumulate ? 1.0f : 0.0f, dx, k);
}

void linear_backward_weight(const float* dy, const float* x, float* dw, float* dbias, int64_t m, int64_t n,
                            int64_t k, bool accumulate) {
  gemm(true, false, n, k, m, 1.0f, dy, n, x, k, accumulate ? 1.0f : 0.0f, dw, k);
  if (dbias != nullptr) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t i = 0; i < m; ++i) sum += dy[i * n + j];
      dbias[j] = accumulate ? dbias[j] + float(sum) : float(sum);
    }
  }
}

}  // namespace megatune::executor::reference
