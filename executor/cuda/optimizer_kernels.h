// Multi-tensor optimizer kernels over a table of parameter tensors: deterministic global gradient L2 norm
// (two stages), gradient clipping, and AdamW on fp32 main params/grads/moments writing the bf16 model copy.
// Same math as reference_optimizer.h / adamw_hyper.h. The norm stays on the device (no host sync):
// adamw_step reads it to clip and to skip the whole step when it is not finite. The default kernels move
// eight elements per thread access (16-byte loads and stores) and are bound by memory bandwidth.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "executor/kernels/adamw_hyper.h"

namespace megatune::executor::cuda {

using bf16 = __nv_bfloat16;

struct AdamWTensor {
  float* main_param = nullptr;  // [numel] fp32
  float* main_grad = nullptr;   // [numel] fp32
  float* exp_avg = nullptr;     // [numel] fp32 (m)
  float* exp_avg_sq = nullptr;  // [numel] fp32 (v)
  bf16* model_param = nullptr;  // [numel] bf16 copy the model computes with (may be null)
  int64_t numel = 0;
  int32_t apply_weight_decay = 1;  // Megatron: 0 for biases and norm weights (1-D params)
  int32_t decoupled_lr = 0;        // 1: updated at AdamWHyper::lr_of(true) (Megatron's --decoupled-lr)
};

// The tensors cut into fixed chunks of kChunkElements; built once at setup (allocates its device copy
// there), then used by every step.
class MultiTensorTable {
 public:
  static constexpr int64_t kChunkElements = 65536;
  explicit MultiTensorTable(std::vector<AdamWTensor> tensors);
  ~MultiTensorTable();
  MultiTensorTable(const MultiTensorTable&) = delete;
  MultiTensorTable& operator=(const MultiTensorTable&) = delete;

  const std::vector<AdamWTensor>& tensors() const { return tensors_; }
  int64_t num_chunks() const { return num_chunks_; }
  int64_t total_elements() const { return total_elements_; }
  const AdamWTensor* device_tensors() const { return device_tensors_; }
  const int64_t* device_chunk_table() const { return device_chunks_; }  // [num_chunks, 2]: tensor, offset

 private:
  std::vector<AdamWTensor> tensors_;
  int64_t num_chunks_ = 0;
  int64_t total_elements_ = 0;
  AdamWTensor* device_tensors_ = nullptr;
  int64_t* device_chunks_ = nullptr;
};

// How the kernels walk a chunk.
//  kVectorized (default): thread t owns groups of 8 consecutive elements (t, t + threads, ... in group
//    units); a group moves with 16-byte accesses when every buffer of its tensor is 16-byte aligned, else
//    element by element (also the last, partial group of a tensor). The per-element arithmetic and each
//    thread's summation order do not depend on which of the two paths ran.
//  kScalar: one element per thread per pass (element t, t + threads, ...), 4-byte accesses. The former
//    kernels, kept as the baseline of bench_optimizer_gpu and the bitwise reference of the AdamW update.
// AdamW and clipping give bitwise the same results under both; the gradient norm sums in another order
// (each is deterministic on its own).
enum class OptimizerKernelVariant { kVectorized, kScalar };

size_t grad_norm_workspace_bytes(const MultiTensorTable& table);
// *norm_device = sqrt(sum of squares of every main_grad), deterministic (fixed chunking and order).
void global_grad_norm(const MultiTensorTable& table, float* norm_device, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream,
                      OptimizerKernelVariant variant = OptimizerKernelVariant::kVectorized);
// main_grad *= adamw_clip_coefficient(*norm_device, max_grad_norm) (no-op when the norm is not finite).
void clip_grads_by_norm(const MultiTensorTable& table, const float* norm_device, float max_grad_norm,
                        cudaStream_t stream,
                        OptimizerKernelVariant variant = OptimizerKernelVariant::kVectorized);
// One AdamW step over every tensor. grad_norm_device: the global norm (clip by hyper.max_grad_norm when > 0;
// a non-finite norm skips the step entirely); may be null when hyper.max_grad_norm == 0 (no skip check).
void adamw_step(const MultiTensorTable& table, const AdamWHyper& hyper, const float* grad_norm_device,
                cudaStream_t stream, OptimizerKernelVariant variant = OptimizerKernelVariant::kVectorized);
// Bytes one AdamW step moves per element: fp32 param, grad, m, v read; param, m, v written; bf16 copy written
// (30 with a model copy, 28 without). The gradient norm reads 4 bytes per element.
constexpr int64_t kAdamWBytesPerElement = 7 * 4 + 2;

}  // namespace megatune::executor::cuda
