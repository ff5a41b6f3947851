// CPU reference AdamW step, global gradient norm and scaling.
#include "executor/kernels/reference_optimizer.h"

#include <cmath>

#include "executor/kernels/reference_elementwise.h"

namespace megatune::executor::reference {

void adamw_step(float* main_param, const float* main_grad, float* exp_avg, float* exp_avg_sq,
                float* model_param, int64_t numel, const AdamWHyper& hyper, bool apply_weight_decay,
                float clip) {
  const float bc1 = hyper.bias_correction1(), bc2 = hyper.bias_correction2();
  for (int64_t i = 0; i < numel; ++i) {
    const float g = main_grad[i] * clip;
    exp_avg[i] = hyper.beta1 * exp_avg[i] + (1.0f - hyper.beta1) * g;
    exp_avg_sq[i] = hyper.beta2 * exp_avg_sq[i] + (1.0f - hyper.beta2) * g * g;
    float p = main_param[i];
    if (apply_weight_decay) p -= hyper.lr * hyper.weight_decay * p;
    p -= hyper.lr * (exp_avg[i] / bc1) / (std::sqrt(exp_avg_sq[i] / bc2) + hyper.eps);
    main_param[i] = p;
    if (model_param != nullptr) model_param[i] = round_to_bf16(p);
  }
}

float global_grad_norm(std::span<const GradTensor> grads) {
  double sum = 0;
  for (const GradTensor& g : grads)
    for (int64_t i = 0; i < g.numel; ++i) sum += double(g.data[i]) * double(g.data[i]);
  return float(std::sqrt(sum));
}

void scale_inplace(float* x, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

}  // namespace megatune::executor::reference
