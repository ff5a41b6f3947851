// Multi-tensor optimizer kernels: one block per fixed chunk of a tensor (chunk table built once), so the
// gradient norm's partial sums have a fixed order (deterministic) and AdamW streams every tensor in one
// launch.
#include <stdexcept>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/kernel_utils.cuh"
#include "executor/cuda/optimizer_kernels.h"

namespace megatune::executor::cuda {
namespace {

constexpr int kThreads = 512;

__global__ void grad_norm_partial_kernel(const AdamWTensor* tensors, const int64_t* chunks, float* partial) {
  const int64_t chunk = blockIdx.x;
  const AdamWTensor& t = tensors[chunks[2 * chunk]];
  const int64_t begin = chunks[2 * chunk + 1];
  const int64_t end = min(t.numel, begin + MultiTensorTable::kChunkElements);
  float sum = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float g = t.main_grad[i];
    sum += g * g;
  }
  sum = detail::block_sum(sum);
  if (threadIdx.x == 0) partial[chunk] = sum;
}

__global__ void grad_norm_final_kernel(const float* partial, int64_t chunks, float* norm) {
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < chunks; i += blockDim.x) sum += partial[i];
  sum = detail::block_sum(sum);
  if (threadIdx.x == 0) *norm = sqrtf(sum);
}

__device__ __forceinline__ float clip_coefficient(const float* norm, float max_norm) {
  if (norm == nullptr || max_norm <= 0.0f) return 1.0f;
  const float c = max_norm / (*norm + 1e-6f);
  return c < 1.0f ? c : 1.0f;
}

__global__ void clip_kernel(const AdamWTensor* tensors, const int64_t* chunks, const float* norm,
                            float max_norm) {
  if (!isfinite(*norm)) return;
  const float clip = clip_coefficient(norm, max_norm);
  if (clip == 1.0f) return;
  const int64_t chunk = blockIdx.x;
  const AdamWTensor& t = tensors[chunks[2 * chunk]];
  const int64_t begin = chunks[2 * chunk + 1];
  const int64_t end = min(t.numel, begin + MultiTensorTable::kChunkElements);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) t.main_grad[i] *= clip;
}

struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2, max_grad_norm;
};

__global__ void adamw_kernel(const AdamWTensor* tensors, const int64_t* chunks, AdamWStep step,
                             const float* grad_norm) {
  if (grad_norm != nullptr && !isfinite(*grad_norm)) return;  // skipped iteration
  const float clip = clip_coefficient(grad_norm, step.max_grad_norm);
  const int64_t chunk = blockIdx.x;
  const AdamWTensor& t = tensors[chunks[2 * chunk]];
  const int64_t begin = chunks[2 * chunk + 1];
  const int64_t end = min(t.numel, begin + MultiTensorTable::kChunkElements);
  const float decay = t.apply_weight_decay ? step.lr * step.weight_decay : 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float g = t.main_grad[i] * clip;
    const float m = step.beta1 * t.exp_avg[i] + (1.0f - step.beta1) * g;
    const float v = step.beta2 * t.exp_avg_sq[i] + (1.0f - step.beta2) * g * g;
    t.exp_avg[i] = m;
    t.exp_avg_sq[i] = v;
    float p = t.main_param[i];
    p -= decay * p;
    p -= step.lr * (m / step.bias_correction1) / (sqrtf(v / step.bias_correction2) + step.eps);
    t.main_param[i] = p;
    if (t.model_param != nullptr) t.model_param[i] = __float2bfloat16_rn(p);
  }
}

}  // namespace

MultiTensorTable::MultiTensorTable(std::vector<AdamWTensor> tensors) : tensors_(std::move(tensors)) {
  std::vector<int64_t> chunk_table;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const AdamWTensor& t = tensors_[i];
    if (t.numel < 0 || (t.numel > 0 && (!t.main_param || !t.main_grad || !t.exp_avg || !t.exp_avg_sq)))
      throw std::invalid_argument("MultiTensorTable: tensor " + std::to_string(i) + " lacks a buffer");
    for (int64_t offset = 0; offset < t.numel; offset += kChunkElements) {
      chunk_table.push_back(int64_t(i));
      chunk_table.push_back(offset);
    }
    total_elements_ += t.numel;
  }
  num_chunks_ = int64_t(chunk_table.size() / 2);
  if (!tensors_.empty()) {
    MEGATUNE_CUDA_CHECK(cudaMalloc(&device_tensors_, tensors_.size() * sizeof(AdamWTensor)));
    MEGATUNE_CUDA_CHECK(cudaMemcpy(device_tensors_, tensors_.data(), tensors_.size() * sizeof(AdamWTensor),
                                   cudaMemcpyHostToDevice));
  }
  if (num_chunks_ > 0) {
    MEGATUNE_CUDA_CHECK(cudaMalloc(&device_chunks_, chunk_table.size() * sizeof(int64_t)));
    MEGATUNE_CUDA_CHECK(cudaMemcpy(device_chunks_, chunk_table.data(), chunk_table.size() * sizeof(int64_t),
                                   cudaMemcpyHostToDevice));
  }
}

MultiTensorTable::~MultiTensorTable() {
  if (device_chunks_) cudaFree(device_chunks_);
  if (device_tensors_) cudaFree(device_tensors_);
}

size_t grad_norm_workspace_bytes(const MultiTensorTable& table) {
  return size_t(table.num_chunks() > 0 ? table.num_chunks() : 1) * sizeof(float);
}

void global_grad_norm(const MultiTensorTable& table, float* norm_device, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream) {
  if (workspace_bytes < grad_norm_workspace_bytes(table))
    throw std::invalid_argument("global_grad_norm: workspace smaller than grad_norm_workspace_bytes()");
  auto* partial = static_cast<float*>(workspace);
  if (table.num_chunks() > 0) {
    grad_norm_partial_kernel<<<unsigned(table.num_chunks()), kThreads, 0, stream>>>(
        table.device_tensors(), table.device_chunk_table(), partial);
    MEGATUNE_CUDA_CHECK_LAUNCH();
  }
  grad_norm_final_kernel<<<1, 1024, 0, stream>>>(partial, table.num_chunks(), norm_device);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void clip_grads_by_norm(const MultiTensorTable& table, const float* norm_device, float max_grad_norm,
                        cudaStream_t stream) {
  if (table.num_chunks() == 0 || max_grad_norm <= 0) return;
  clip_kernel<<<unsigned(table.num_chunks()), kThreads, 0, stream>>>(
      table.device_tensors(), table.device_chunk_table(), norm_device, max_grad_norm);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void adamw_step(const MultiTensorTable& table, const AdamWHyper& hyper, const float* grad_norm_device,
                cudaStream_t stream) {
  if (hyper.max_grad_norm > 0 && grad_norm_device == nullptr)
    throw std::invalid_argument("adamw_step: clipping (max_grad_norm > 0) needs the device grad norm");
  if (table.num_chunks() == 0) return;
  const AdamWStep step{hyper.lr,
                       hyper.beta1,
                       hyper.beta2,
                       hyper.eps,
                       hyper.weight_decay,
                       hyper.bias_correction1(),
                       hyper.bias_correction2(),
                       hyper.max_grad_norm};
  adamw_kernel<<<unsigned(table.num_chunks()), kThreads, 0, stream>>>(
      table.device_tensors(), table.device_chunk_table(), step, grad_norm_device);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace megatune::executor::cuda
