// Multi-tensor optimizer kernels: one block per fixed chunk of a tensor (chunk table built once), so the
// gradient norm's partial sums have a fixed order (deterministic) and AdamW streams every tensor in one
// launch. The vectorized kernels move groups of eight elements per thread access (two 16-byte fp32 loads
// or stores per buffer, one 16-byte store of the bf16 copy); the scalar kernels are the former loops.
#include <stdexcept>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/kernel_utils.cuh"
#include "executor/cuda/optimizer_kernels.h"

namespace megatune::executor::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kGroup = 8;  // elements per thread access in the vectorized kernels
constexpr int64_t kGroupStride = int64_t(kGroup) * kThreads;

struct AdamWStep {
  float lr, decoupled_lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2, max_grad_norm;
};

__device__ __forceinline__ float clip_coefficient(const float* norm, float max_norm) {
  if (norm == nullptr || max_norm <= 0.0f) return 1.0f;
  const float c = max_norm / (*norm + 1e-6f);
  return c < 1.0f ? c : 1.0f;
}

// ---- The vectorized kernel's per-element AdamW update (adamw_hyper.h's formula and operation order). ----

__device__ __forceinline__ void adamw_element(const AdamWStep& step, float lr, float clip, float decay,
                                              float grad, float& m, float& v, float& p) {
  // The two fused multiply-adds are spelled out: left to itself the compiler contracts m's expression the
  // other way round here (fma(beta1, m, (1 - beta1) g)), which rounds differently from the scalar kernel's
  // fma(1 - beta1, g, beta1 m).
  const float g = grad * clip;
  m = __fmaf_rn(1.0f - step.beta1, g, step.beta1 * m);
  v = __fmaf_rn(g, (1.0f - step.beta2) * g, step.beta2 * v);
  p -= decay * p;
  p -= lr * (m / step.bias_correction1) / (sqrtf(v / step.bias_correction2) + step.eps);
}

// The tensor's rate: the decoupled group's (the word embeddings, the output layer) or the default one.
__device__ __forceinline__ float tensor_lr(const AdamWStep& step, const AdamWTensor& t) {
  return t.decoupled_lr ? step.decoupled_lr : step.lr;
}

// ---- Scalar kernels: one element per thread per pass. ----

__global__ void grad_norm_partial_scalar_kernel(const AdamWTensor* tensors, const int64_t* chunks,
                                                float* partial) {
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

__global__ void clip_scalar_kernel(const AdamWTensor* tensors, const int64_t* chunks, const float* norm,
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

__global__ void adamw_scalar_kernel(const AdamWTensor* tensors, const int64_t* chunks, AdamWStep step,
                                    const float* grad_norm) {
  if (grad_norm != nullptr && !isfinite(*grad_norm)) return;  // skipped iteration
  const float clip = clip_coefficient(grad_norm, step.max_grad_norm);
  const int64_t chunk = blockIdx.x;
  const AdamWTensor& t = tensors[chunks[2 * chunk]];
  const int64_t begin = chunks[2 * chunk + 1];
  const int64_t end = min(t.numel, begin + MultiTensorTable::kChunkElements);
  const float lr = tensor_lr(step, t);
  const float decay = t.apply_weight_decay ? lr * step.weight_decay : 0.0f;
  // The update written out as in the former kernel (not through adamw_element), so the tests that hold the
  // vectorized kernel bitwise equal to this one compare against an independent transcription.
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float g = t.main_grad[i] * clip;
    const float m = step.beta1 * t.exp_avg[i] + (1.0f - step.beta1) * g;
    const float v = step.beta2 * t.exp_avg_sq[i] + (1.0f - step.beta2) * g * g;
    t.exp_avg[i] = m;
    t.exp_avg_sq[i] = v;
    float p = t.main_param[i];
    p -= decay * p;
    p -= lr * (m / step.bias_correction1) / (sqrtf(v / step.bias_correction2) + step.eps);
    t.main_param[i] = p;
    if (t.model_param != nullptr) t.model_param[i] = __float2bfloat16_rn(p);
  }
}

// ---- Vectorized kernels: groups of kGroup elements. ----

// This block's chunk: its tensor (copied to registers, so the buffers' stores cannot alias the pointers)
// and its element range [begin, end).
struct Chunk {
  AdamWTensor tensor;
  int64_t begin, end;
};

__device__ __forceinline__ Chunk this_chunk(const AdamWTensor* tensors, const int64_t* chunks) {
  const int64_t chunk = blockIdx.x;
  Chunk c;
  c.tensor = tensors[chunks[2 * chunk]];
  c.begin = chunks[2 * chunk + 1];
  c.end = min(c.tensor.numel, c.begin + MultiTensorTable::kChunkElements);
  return c;
}

__device__ __forceinline__ bool is_aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// One group: x[0, count) from p. `vector`: count == kGroup and p 16-byte aligned -> two 16-byte loads
// (streaming: every optimizer byte is used once); else element loads, the missing tail read as 0.
__device__ __forceinline__ void load_group(const float* p, bool vector, int count, float (&x)[kGroup]) {
  if (vector) {
    const float4 a = __ldcs(reinterpret_cast<const float4*>(p));
    const float4 b = __ldcs(reinterpret_cast<const float4*>(p) + 1);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
    return;
  }
#pragma unroll
  for (int k = 0; k < kGroup; ++k) x[k] = k < count ? p[k] : 0.0f;
}

__device__ __forceinline__ void store_group(float* p, bool vector, int count, const float (&x)[kGroup]) {
  if (vector) {
    __stcs(reinterpret_cast<float4*>(p), make_float4(x[0], x[1], x[2], x[3]));
    __stcs(reinterpret_cast<float4*>(p) + 1, make_float4(x[4], x[5], x[6], x[7]));
    return;
  }
#pragma unroll
  for (int k = 0; k < kGroup; ++k)
    if (k < count) p[k] = x[k];
}

// bf16(x) for the group: one 16-byte store when `vector`. Both paths round to nearest even.
__device__ __forceinline__ void store_group_bf16(bf16* p, bool vector, int count, const float (&x)[kGroup]) {
  if (vector) {
    const detail::Bf16x8 packed = detail::pack(x);
    __stcs(reinterpret_cast<uint4*>(p), *reinterpret_cast<const uint4*>(&packed));
    return;
  }
#pragma unroll
  for (int k = 0; k < kGroup; ++k)
    if (k < count) p[k] = __float2bfloat16_rn(x[k]);
}

__global__ void __launch_bounds__(kThreads)
    grad_norm_partial_vector_kernel(const AdamWTensor* tensors, const int64_t* chunks, float* partial) {
  const Chunk c = this_chunk(tensors, chunks);
  const float* __restrict__ grad = c.tensor.main_grad;
  const bool aligned = is_aligned16(grad);
  float sum = 0.0f;
  for (int64_t i = c.begin + int64_t(kGroup) * threadIdx.x; i < c.end; i += kGroupStride) {
    const int count = int(min(int64_t(kGroup), c.end - i));
    float g[kGroup];
    load_group(grad + i, aligned && count == kGroup, count, g);
#pragma unroll
    for (int k = 0; k < kGroup; ++k) sum += g[k] * g[k];  // a missing tail element adds +0: no change
  }
  sum = detail::block_sum(sum);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ void __launch_bounds__(kThreads)
    clip_vector_kernel(const AdamWTensor* tensors, const int64_t* chunks, const float* norm, float max_norm) {
  if (!isfinite(*norm)) return;
  const float clip = clip_coefficient(norm, max_norm);
  if (clip == 1.0f) return;
  const Chunk c = this_chunk(tensors, chunks);
  float* __restrict__ grad = c.tensor.main_grad;
  const bool aligned = is_aligned16(grad);
  for (int64_t i = c.begin + int64_t(kGroup) * threadIdx.x; i < c.end; i += kGroupStride) {
    const int count = int(min(int64_t(kGroup), c.end - i));
    const bool vector = aligned && count == kGroup;
    float g[kGroup];
    load_group(grad + i, vector, count, g);
#pragma unroll
    for (int k = 0; k < kGroup; ++k) g[k] *= clip;
    store_group(grad + i, vector, count, g);
  }
}

__global__ void __launch_bounds__(kThreads)
    adamw_vector_kernel(const AdamWTensor* tensors, const int64_t* chunks, AdamWStep step,
                        const float* grad_norm) {
  if (grad_norm != nullptr && !isfinite(*grad_norm)) return;  // skipped iteration
  const float clip = clip_coefficient(grad_norm, step.max_grad_norm);
  const Chunk c = this_chunk(tensors, chunks);
  float* __restrict__ param = c.tensor.main_param;
  const float* __restrict__ grad = c.tensor.main_grad;
  float* __restrict__ exp_avg = c.tensor.exp_avg;
  float* __restrict__ exp_avg_sq = c.tensor.exp_avg_sq;
  bf16* __restrict__ model = c.tensor.model_param;
  const bool aligned = is_aligned16(param) && is_aligned16(grad) && is_aligned16(exp_avg) &&
                       is_aligned16(exp_avg_sq) && (model == nullptr || is_aligned16(model));
  const float lr = tensor_lr(step, c.tensor);
  const float decay = c.tensor.apply_weight_decay ? lr * step.weight_decay : 0.0f;
  for (int64_t i = c.begin + int64_t(kGroup) * threadIdx.x; i < c.end; i += kGroupStride) {
    const int count = int(min(int64_t(kGroup), c.end - i));
    const bool vector = aligned && count == kGroup;
    float g[kGroup], m[kGroup], v[kGroup], p[kGroup];
    load_group(grad + i, vector, count, g);
    load_group(exp_avg + i, vector, count, m);
    load_group(exp_avg_sq + i, vector, count, v);
    load_group(param + i, vector, count, p);
#pragma unroll
    for (int k = 0; k < kGroup; ++k) adamw_element(step, lr, clip, decay, g[k], m[k], v[k], p[k]);
    store_group(exp_avg + i, vector, count, m);
    store_group(exp_avg_sq + i, vector, count, v);
    store_group(param + i, vector, count, p);
    if (model != nullptr) store_group_bf16(model + i, vector, count, p);
  }
}

__global__ void grad_norm_final_kernel(const float* partial, int64_t chunks, float* norm) {
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < chunks; i += blockDim.x) sum += partial[i];
  sum = detail::block_sum(sum);
  if (threadIdx.x == 0) *norm = sqrtf(sum);
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
                      size_t workspace_bytes, cudaStream_t stream, OptimizerKernelVariant variant) {
  if (workspace_bytes < grad_norm_workspace_bytes(table))
    throw std::invalid_argument("global_grad_norm: workspace smaller than grad_norm_workspace_bytes()");
  auto* partial = static_cast<float*>(workspace);
  if (table.num_chunks() > 0) {
    if (variant == OptimizerKernelVariant::kVectorized)
      grad_norm_partial_vector_kernel<<<unsigned(table.num_chunks()), kThreads, 0, stream>>>(
          table.device_tensors(), table.device_chunk_table(), partial);
    else
      grad_norm_partial_scalar_kernel<<<unsigned(table.num_chunks()), kThreads, 0, stream>>>(
          table.device_tensors(), table.device_chunk_table(), partial);
    MEGATUNE_CUDA_CHECK_LAUNCH();
  }
  grad_norm_final_kernel<<<1, 1024, 0, stream>>>(partial, table.num_chunks(), norm_device);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void clip_grads_by_norm(const MultiTensorTable& table, const float* norm_device, float max_grad_norm,
                        cudaStream_t stream, OptimizerKernelVariant variant) {
  if (table.num_chunks() == 0 || max_grad_norm <= 0) return;
  if (variant == OptimizerKernelVariant::kVectorized)
    clip_vector_kernel<<<unsigned(table.num_chunks()), kThreads, 0, stream>>>(
        table.device_tensors(), table.device_chunk_table(), norm_device, max_grad_norm);
  else
    clip_scalar_kernel<<<unsigned(table.num_chunks()), kThreads, 0, stream>>>(
        table.device_tensors(), table.device_chunk_table(), norm_device, max_grad_norm);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void adamw_step(const MultiTensorTable& table, const AdamWHyper& hyper, const float* grad_norm_device,
                cudaStream_t stream, OptimizerKernelVariant variant) {
  if (hyper.max_grad_norm > 0 && grad_norm_device == nullptr)
    throw std::invalid_argument("adamw_step: clipping (max_grad_norm > 0) needs the device grad norm");
  if (table.num_chunks() == 0) return;
  const AdamWStep step{hyper.lr,
                       hyper.lr_of(true),
                       hyper.beta1,
                       hyper.beta2,
                       hyper.eps,
                       hyper.weight_decay,
                       hyper.bias_correction1(),
                       hyper.bias_correction2(),
                       hyper.max_grad_norm};
  if (variant == OptimizerKernelVariant::kVectorized)
    adamw_vector_kernel<<<unsigned(table.num_chunks()), kThreads, 0, stream>>>(
        table.device_tensors(), table.device_chunk_table(), step, grad_norm_device);
  else
    adamw_scalar_kernel<<<unsigned(table.num_chunks()), kThreads, 0, stream>>>(
        table.device_tensors(), table.device_chunk_table(), step, grad_norm_device);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace megatune::executor::cuda
