// Device helpers shared by the fused kernels: 16-byte bf16 vectors, warp/block reductions, grid sizing.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace megatune::executor::cuda::detail {

// Eight bf16 values moved as one 16-byte access.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 pair[4];
};

__device__ __forceinline__ void unpack(const Bf16x8& v, float (&out)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(v.pair[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ Bf16x8 pack(const float (&in)[8]) {
  Bf16x8 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.pair[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  return v;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// Deterministic: fixed shuffle tree, then warp partials summed in warp order. Uses 33 floats of shared
// memory.
__device__ __forceinline__ float block_sum(float x) {
  __shared__ float partial[33];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  x = warp_sum(x);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  if (warp == 0) {
    float y = lane < warps ? partial[lane] : 0.0f;
    y = warp_sum(y);
    if (lane == 0) partial[32] = y;
  }
  __syncthreads();
  return partial[32];
}

__device__ __forceinline__ float block_max(float x) {
  __shared__ float partial[33];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  if (warp == 0) {
    float y = lane < warps ? partial[lane] : -INFINITY;
    y = warp_max(y);
    if (lane == 0) partial[32] = y;
  }
  __syncthreads();
  return partial[32];
}

inline unsigned grid_for(int64_t work_items, int threads, int64_t max_blocks = 132 * 32) {
  int64_t blocks = (work_items + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > max_blocks) blocks = max_blocks;
  return unsigned(blocks);
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy (cp.async, L2 only); zero-fills when !valid. Completion: commit groups and
// cp_async_wait<N> (at most N of this thread's groups still in flight).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Second stage of the deterministic column reductions (bias gradients, dgamma / dbeta): out[c] (+)= the sum
// over chunks of partial[chunk * cols + c], for one or two partial arrays (b may be null). A block is 32
// columns (lanes) x kColumnReduceWarps warps: warp w sums chunks w, w + kColumnReduceWarps, ... in order,
// then lane c's warp sums are added in warp order, so the bits do not depend on the launch. Launched by
// column_reduce() below. (A template so that every translation unit that launches it has its own instance.)
constexpr int kColumnReduceWarps = 16;

template <int Warps = kColumnReduceWarps>
__global__ void __launch_bounds__(32 * Warps)
    column_reduce_kernel(const float* partial_a, const float* partial_b, float* out_a, float* out_b,
                         int64_t chunks, int64_t cols, bool accumulate) {
  __shared__ float2 warp_sums[Warps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c = int64_t(blockIdx.x) * 32 + lane;
  float a = 0.0f, b = 0.0f;
  if (c < cols) {
#pragma unroll 4
    for (int64_t k = warp; k < chunks; k += Warps) {
      a += partial_a[k * cols + c];
      if (partial_b) b += partial_b[k * cols + c];
    }
  }
  warp_sums[warp][lane] = make_float2(a, b);
  __syncthreads();
  if (warp == 0 && c < cols) {
    float2 total = warp_sums[0][lane];
#pragma unroll
    for (int w = 1; w < Warps; ++w) total.x += warp_sums[w][lane].x, total.y += warp_sums[w][lane].y;
    out_a[c] = accumulate ? out_a[c] + total.x : total.x;
    if (out_b) out_b[c] = accumulate ? out_b[c] + total.y : total.y;
  }
}

// Launches column_reduce_kernel over cols columns on stream (launch errors: MEGATUNE_CUDA_CHECK_LAUNCH
// after).
template <int Warps = kColumnReduceWarps>  // a template: instantiated only where it is launched
void column_reduce(const float* partial_a, const float* partial_b, float* out_a, float* out_b, int64_t chunks,
                   int64_t cols, bool accumulate, cudaStream_t stream) {
  column_reduce_kernel<Warps><<<unsigned((cols + 31) / 32), 32 * Warps, 0, stream>>>(
      partial_a, partial_b, out_a, out_b, chunks, cols, accumulate);
}

}  // namespace megatune::executor::cuda::detail
