// Small-k GEMM: one block per row of C; A's row in shared memory, each thread 8 columns of C at a time, B's k
// rows read through the cache (B is k x n, a few tens of KiB, shared by every row).
#include <algorithm>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/kernel_utils.cuh"
#include "executor/cuda/small_k_gemm_kernels.h"

namespace megatune::executor::cuda {
namespace {

using detail::Bf16x8;

constexpr int kThreads = 256;

__global__ void small_k_gemm_kernel(const bf16* a, int64_t lda, const bf16* b, int64_t ldb, bf16* c,
                                    int64_t ldc, int64_t n, int k, bool accumulate) {
  __shared__ float a_row[kSmallGemmMaxK];
  const int64_t row = blockIdx.x;
  for (int p = threadIdx.x; p < k; p += blockDim.x) a_row[p] = __bfloat162float(a[row * lda + p]);
  __syncthreads();
  auto* out = reinterpret_cast<Bf16x8*>(c + row * ldc);
  for (int64_t v = threadIdx.x; v < n / 8; v += blockDim.x) {
    float sum[8];
    if (accumulate) {
      detail::unpack(out[v], sum);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) sum[i] = 0.0f;
    }
    for (int p = 0; p < k; ++p) {
      float w[8];
      detail::unpack(reinterpret_cast<const Bf16x8*>(b + int64_t(p) * ldb)[v], w);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum[i] += a_row[p] * w[i];
    }
    out[v] = detail::pack(sum);
  }
}

}  // namespace

bool small_k_gemm_supports(int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, const void* a,
                           const void* b, const void* c) {
  (void)a;  // A is read element by element
  return k >= 1 && k <= kSmallGemmMaxK && n > 0 && n % 8 == 0 && ldb % 8 == 0 && ldc % 8 == 0 && lda >= k &&
         detail::aligned16(b) && detail::aligned16(c);
}

void small_k_gemm(const bf16* a, int64_t lda, const bf16* b, int64_t ldb, bf16* c, int64_t ldc, int64_t m,
                  int64_t n, int64_t k, bool accumulate, cudaStream_t stream) {
  if (m <= 0) return;
  const unsigned threads =
      unsigned(std::min<int64_t>(kThreads, std::max<int64_t>(32, (n / 8 + 31) / 32 * 32)));
  small_k_gemm_kernel<<<unsigned(m), threads, 0, stream>>>(a, lda, b, ldb, c, ldc, n, int(k), accumulate);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace megatune::executor::cuda
