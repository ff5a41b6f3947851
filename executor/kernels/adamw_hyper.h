// AdamWHyper: the hyper-parameters of one AdamW step (Megatron/PyTorch AdamW with decoupled weight decay),
// shared by the CPU reference and the CUDA multi-tensor kernel.
#pragma once
#include <cmath>
#include <cstdint>

namespace megatune::executor {

struct AdamWHyper {
  float lr = 1e-4f;
  // The rate of the tensors flagged decoupled (Megatron's --decoupled-lr group: the word embeddings and the
  // output layer); < 0: lr.
  float decoupled_lr = -1.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;  // applied only to tensors flagged for decay (Megatron: not to 1-D params)
  int64_t step = 1;            // 1-based step count after this update (bias correction 1 - beta^step)
  float max_grad_norm = 0;     // > 0: clip grads by min(1, max_grad_norm / (norm + 1e-6)); 0: no clipping

  float lr_of(bool decoupled) const { return decoupled && decoupled_lr >= 0 ? decoupled_lr : lr; }
  float bias_correction1() const { return 1.0f - std::pow(beta1, float(step)); }
  float bias_correction2() const { return 1.0f - std::pow(beta2, float(step)); }
};

// The update, per element, with g = grad * clip (clip from the global norm):
//   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
//   p = p - lr * (wd * p)                                   (decoupled decay, when the tensor decays)
//   p = p - lr * (m / bc1) / (sqrt(v / bc2) + eps)
// then the bf16 model copy receives round(p). A non-finite global norm skips the whole step.
inline float adamw_clip_coefficient(float grad_norm, float max_grad_norm) {
  if (max_grad_norm <= 0) return 1.0f;
  float c = max_grad_norm / (grad_norm + 1e-6f);
  return c < 1.0f ? c : 1.0f;
}

}  // namespace megatune::executor
