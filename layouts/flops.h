// Model FLOPs per training iteration (Megatron's num_floating_point_operations), MFU, and the peak
// dense throughput of known GPUs.
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

// Number format of a peak rate (layouts/op.h has the tensor DType; this one also knows tf32).
enum class PeakPrecision { kFp32, kTf32, kBf16, kFp16, kFp8 };
std::string_view to_string(PeakPrecision precision);        // "fp32" | "tf32" | "bf16" | "fp16" | "fp8"
PeakPrecision parse_peak_precision(std::string_view text);  // UserError on unknown text

// Datasheet dense (no sparsity) peak in TFLOP/s per GPU. `gpu_name` is matched case-insensitively and
// loosely: "H100", "h100-sxm", "NVIDIA H100 80GB HBM3" (the CUDA device name), "H200", "A100", "B200", ...
// Unknown GPU or precision: UserError naming the input and listing the known GPUs.
double peak_dense_tflops(std::string_view gpu_name, PeakPrecision precision = PeakPrecision::kBf16);
std::vector<std::string> known_gpu_names();

}  // namespace megatune::layouts
