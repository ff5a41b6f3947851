// Element-wise and small reduction kernels (casts, add/axpby/scale, column sums, sums, NaN/inf count).
#include <stdexcept>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/elementwise_kernels.h"
#include "executor/cuda/kernel_utils.cuh"

namespace megatune::executor::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kColumnSumRowsPerChunk = 64;

__global__ void cast_fp32_to_bf16_kernel(const float* x, bf16* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void cast_bf16_to_fp32_kernel(const bf16* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __bfloat162float(x[i]);
}

__global__ void add_bf16_kernel(const bf16* a, const bf16* b, bf16* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

__global__ void add_bf16_vec_kernel(const detail::Bf16x8* a, const detail::Bf16x8* b, detail::Bf16x8* out,
                                    int64_t n8) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8;
       i += int64_t(gridDim.x) * blockDim.x) {
    float x[8], y[8];
    detail::unpack(a[i], x);
    detail::unpack(b[i], y);
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] += y[j];
    out[i] = detail::pack(x);
  }
}

__global__ void axpby_kernel(float alpha, const float* x, float beta, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = beta == 0.0f ? alpha * x[i] : alpha * x[i] + beta * out[i];
}

__global__ void scale_kernel(float* x, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= scale;
}

// Stage 1: partial[chunk, col] = sum of x over the chunk's rows (one thread per column, rows in order).
__global__ void column_sum_partial_kernel(const bf16* x, float* partial, int64_t rows, int64_t cols) {
  const int64_t col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  if (col >= cols) return;
  const int64_t row_end = min(rows, (chunk + 1) * kColumnSumRowsPerChunk);
  float sum = 0.0f;
  for (int64_t r = chunk * kColumnSumRowsPerChunk; r < row_end; ++r)
    sum += __bfloat162float(x[r * cols + col]);
  partial[chunk * cols + col] = sum;
}

// Stage 1 for widths that are multiples of 8 (16-byte aligned rows): a block is kColumnSumGroups row groups
// x kColumnSumVectors 8-column vectors; group g sums its kColumnSumRowsPerChunk / kColumnSumGroups rows of
// the chunk in order (eight 16-byte loads in flight per thread), then the groups' sums are added in group
// order through shared memory. (The scalar kernel above adds a chunk's rows in one sequence: the two agree
// within rounding, each is deterministic.) Stage 2: detail::column_reduce_kernel.
constexpr int kColumnSumGroups = 4, kColumnSumVectors = 64;

__global__ void __launch_bounds__(kColumnSumGroups* kColumnSumVectors)
    column_sum_partial_vec_kernel(const bf16* x, float* partial, int64_t rows, int64_t cols) {
  __shared__ float group_sums[kColumnSumGroups - 1][kColumnSumVectors][9];  // 9: no bank conflicts
  const int lane_v = threadIdx.x % kColumnSumVectors, group = threadIdx.x / kColumnSumVectors;
  const int64_t v = int64_t(blockIdx.x) * kColumnSumVectors + lane_v;  // 8-column vector index
  const int64_t chunk = blockIdx.y;
  constexpr int64_t kGroupRows = kColumnSumRowsPerChunk / kColumnSumGroups;
  const int64_t row_begin = chunk * kColumnSumRowsPerChunk + group * kGroupRows;
  const int64_t row_end = min(rows, row_begin + kGroupRows);
  float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (v < cols / 8) {
#pragma unroll 8
    for (int64_t r = row_begin; r < row_end; ++r) {
      float a[8];
      detail::unpack(reinterpret_cast<const detail::Bf16x8*>(x + r * cols)[v], a);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum[i] += a[i];
    }
  }
  if (group > 0) {
#pragma unroll
    for (int i = 0; i < 8; ++i) group_sums[group - 1][lane_v][i] = sum[i];
  }
  __syncthreads();
  if (group == 0 && v < cols / 8) {
#pragma unroll
    for (int gi = 0; gi < kColumnSumGroups - 1; ++gi)
#pragma unroll
      for (int i = 0; i < 8; ++i) sum[i] += group_sums[gi][lane_v][i];
    auto* out = reinterpret_cast<float4*>(partial + chunk * cols + v * 8);
    out[0] = make_float4(sum[0], sum[1], sum[2], sum[3]);
    out[1] = make_float4(sum[4], sum[5], sum[6], sum[7]);
  }
}

__global__ void sum_kernel(const float* x, int64_t n, float* out) {
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += x[i];
  sum = detail::block_sum(sum);
  if (threadIdx.x == 0) *out = sum;
}

template <typename T>
__global__ void count_nonfinite_kernel(const T* x, int64_t n, int* count) {
  int local = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v;
    if constexpr (sizeof(T) == 4) {
      v = x[i];
    } else {
      v = __bfloat162float(x[i]);
    }
    local += isfinite(v) ? 0 : 1;
  }
  for (int offset = 16; offset > 0; offset >>= 1) local += __shfl_xor_sync(0xffffffffu, local, offset);
  if ((threadIdx.x & 31) == 0 && local != 0) atomicAdd(count, local);
}

}  // namespace

void cast_fp32_to_bf16(const float* x, bf16* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  cast_fp32_to_bf16_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(x, y, n);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void cast_bf16_to_fp32(const bf16* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  cast_bf16_to_fp32_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(x, y, n);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void add_bf16(const bf16* a, const bf16* b, bf16* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (n % 8 == 0 && detail::aligned16(a) && detail::aligned16(b) && detail::aligned16(out)) {
    add_bf16_vec_kernel<<<detail::grid_for(n / 8, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<const detail::Bf16x8*>(a), reinterpret_cast<const detail::Bf16x8*>(b),
        reinterpret_cast<detail::Bf16x8*>(out), n / 8);
    MEGATUNE_CUDA_CHECK_LAUNCH();
    return;
  }
  add_bf16_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(a, b, out, n);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void axpby_fp32(float alpha, const float* x, float beta, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  axpby_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(alpha, x, beta, out, n);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void scale_fp32_inplace(float* x, int64_t n, float scale, cudaStream_t stream) {
  if (n <= 0) return;
  scale_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, scale);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

size_t column_sum_workspace_bytes(int64_t rows, int64_t cols) {
  return size_t((rows + kColumnSumRowsPerChunk - 1) / kColumnSumRowsPerChunk) * size_t(cols) * sizeof(float);
}

void column_sum_bf16(const bf16* x, float* sums, int64_t rows, int64_t cols, bool accumulate, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream) {
  if (cols <= 0) return;
  if (workspace_bytes < column_sum_workspace_bytes(rows, cols))
    throw std::invalid_argument("column_sum_bf16: workspace smaller than column_sum_workspace_bytes()");
  const int64_t chunks = (rows + kColumnSumRowsPerChunk - 1) / kColumnSumRowsPerChunk;
  const unsigned col_blocks = unsigned((cols + kThreads - 1) / kThreads);
  auto* partial = static_cast<float*>(workspace);
  if (chunks > 0 && cols % 8 == 0 && detail::aligned16(x) && detail::aligned16(partial)) {
    const unsigned vec_blocks = unsigned((cols / 8 + kColumnSumVectors - 1) / kColumnSumVectors);
    column_sum_partial_vec_kernel<<<dim3(vec_blocks, unsigned(chunks)), kColumnSumGroups * kColumnSumVectors,
                                    0, stream>>>(x, partial, rows, cols);
    MEGATUNE_CUDA_CHECK_LAUNCH();
  } else if (chunks > 0) {
    column_sum_partial_kernel<<<dim3(col_blocks, unsigned(chunks)), kThreads, 0, stream>>>(x, partial, rows,
                                                                                           cols);
    MEGATUNE_CUDA_CHECK_LAUNCH();
  }
  detail::column_reduce<>(partial, nullptr, sums, nullptr, chunks, cols, accumulate, stream);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void sum_fp32(const float* x, int64_t n, float* sum_device, cudaStream_t stream) {
  sum_kernel<<<1, 1024, 0, stream>>>(x, n, sum_device);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void count_nonfinite_fp32(const float* x, int64_t n, int* count_device, cudaStream_t stream) {
  if (n <= 0) return;
  count_nonfinite_kernel<float><<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, count_device);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void count_nonfinite_bf16(const bf16* x, int64_t n, int* count_device, cudaStream_t stream) {
  if (n <= 0) return;
  count_nonfinite_kernel<bf16><<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, count_device);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace megatune::executor::cuda
