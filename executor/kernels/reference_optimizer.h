// CPU reference optimizer kernels: AdamW on fp32 main params, global gradient L2 norm, gradient scaling.
#pragma once
#include <cstdint>
#include <span>

#include "executor/kernels/adamw_hyper.h"

namespace megatune::executor::reference {

// One AdamW step over one tensor (see adamw_hyper.h for the formula). clip = adamw_clip_coefficient(...)
// computed by the caller from the global norm. model_param (may be nullptr) receives the bf16-rounded
// copy of the updated param (as float).
void adamw_step(float* main_param, const float* main_grad, float* exp_avg, float* exp_avg_sq,
                float* model_param, int64_t numel, const AdamWHyper& hyper, bool apply_weight_decay,
                float clip);

// Global L2 norm over several gradient tensors, deterministic (fixed order, double accumulation).
struct GradTensor {
  const float* data = nullptr;
  int64_t numel = 0;
};
float global_grad_norm(std::span<const GradTensor> grads);

// x[i] *= scale.
void scale_inplace(float* x, int64_t n, float scale);

}  // namespace megatune::executor::reference
