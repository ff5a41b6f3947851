// Model FLOPs per training iteration (Megatron's num_floating_point_operations) and MFU. The GPU peaks MFU
// divides by are the hardware catalog's (cost_models::device_peak_bf16_tflops).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "layouts/model_spec.h"

namespace megatune::layouts {

// Terms of Megatron's formula (megatron.md §2), in FLOPs for the whole global batch (fwd + bwd).
struct FlopsBreakdown {
  double mlp = 0;               // dense MLP + routed top-k experts + shared experts
  double attention_linear = 0;  // QKV / MLA projections + output projection
  double attention_core = 0;    // QK^T and PV (causal: half)
  double mtp = 0;               // MTP norms + eh-proj (their transformer layers are in mlp/attention)
  double logits = 0;            // output layer of the main model and each MTP head
  double total = 0;
};

// Model FLOPs of one iteration over `global_batch_size` sequences of model.seq_length tokens,
// recomputation not counted; V is the vocabulary padded for `tensor_model_parallel_size` as Megatron does.
FlopsBreakdown model_flops_breakdown(const ModelSpec& model, int64_t global_batch_size,
                                     int tensor_model_parallel_size = 1);
double model_flops_per_iteration(const ModelSpec& model, int64_t global_batch_size,
                                 int tensor_model_parallel_size = 1);

// Model FLOPs utilization: flops / (step_time_s * gpus * peak_tflops_per_gpu * 1e12).
double mfu(double flops, double step_time_s, int gpus, double peak_tflops_per_gpu);

}  // namespace megatune::layouts
