// CPU reference LayerNorm / RMSNorm forward (with fused residual add) and backward.
#include "executor/kernels/reference_norm.h"

#include <cmath>
#include <vector>

namespace megatune::executor::reference {

void norm_forward(NormKind kind, const float* x, const float* residual, const float* gamma, const float* beta,
                  float* y, float* sum_out, float* mean_out, float* rstd_out, int64_t rows, int64_t hidden,
                  float eps) {
  std::vector<float> row(static_cast<size_t>(hidden));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < hidden; ++c) {
      row[c] = x[r * hidden + c] + (residual != nullptr ? residual[r * hidden + c] : 0.0f);
      if (residual != nullptr && sum_out != nullptr) sum_out[r * hidden + c] = row[c];
    }
    double mean = 0, square_sum = 0;
    if (kind == NormKind::kLayerNorm) {
      for (int64_t c = 0; c < hidden; ++c) mean += row[c];
      mean /= double(hidden);
    }
    for (int64_t c = 0; c < hidden; ++c) square_sum += (row[c] - mean) * (row[c] - mean);
    const double rstd = 1.0 / std::sqrt(square_sum / double(hidden) + double(eps));
    if (mean_out != nullptr) mean_out[r] = float(mean);
    rstd_out[r] = float(rstd);
    for (int64_t c = 0; c < hidden; ++c) {
      double out = (row[c] - mean) * rstd * gamma[c];
      if (kind == NormKind::kLayerNorm && beta != nullptr) out += beta[c];
      y[r * hidden + c] = float(out);
    }
  }
}

void norm_backward(NormKind kind, const float* dy, const float* input, const float* gamma, const float* mean,
                   const float* rstd, const float* d_residual, float* dx, float* dgamma, float* dbeta,
                   int64_t rows, int64_t hidden, bool accumulate) {
  std::vector<double> dgamma_acc(static_cast<size_t>(hidden), 0.0),
      dbeta_acc(static_cast<size_t>(hidden), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double mu = kind == NormKind::kLayerNorm ? mean[r] : 0.0;
    const double rs = rstd[r];
    // xhat = (x - mu) * rstd; g = dy * gamma.
    // LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); RMSNorm: dx = rstd * (g - xhat * mean(g *
    // xhat)).
    double mean_g = 0, mean_g_xhat = 0;
    for (int64_t c = 0; c < hidden; ++c) {
      const double xhat = (input[r * hidden + c] - mu) * rs;
      const double g = double(dy[r * hidden + c]) * gamma[c];
      mean_g += g;
      mean_g_xhat += g * xhat;
      dgamma_acc[c] += double(dy[r * hidden + c]) * xhat;
      dbeta_acc[c] += dy[r * hidden + c];
    }
    mean_g /= double(hidden);
    mean_g_xhat /= double(hidden);
    if (kind == NormKind::kRMSNorm) mean_g = 0;
    for (int64_t c = 0; c < hidden; ++c) {
      const double xhat = (input[r * hidden + c] - mu) * rs;
      const double g = double(dy[r * hidden + c]) * gamma[c];
      double out = rs * (g - mean_g - xhat * mean_g_xhat);
      if (d_residual != nullptr) out += d_residual[r * hidden + c];
      dx[r * hidden + c] = float(out);
    }
  }
  for (int64_t c = 0; c < hidden; ++c) {
    dgamma[c] = float(accumulate ? dgamma[c] + dgamma_acc[c] : dgamma_acc[c]);
    if (dbeta != nullptr) dbeta[c] = float(accumulate ? dbeta[c] + dbeta_acc[c] : dbeta_acc[c]);
  }
}

}  // namespace megatune::executor::reference
