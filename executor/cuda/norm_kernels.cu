// LayerNorm / RMSNorm kernels. The forward of rows up to 2048 wide (32 lanes x 8 vectors of 8) takes one
// warp per row, the row held packed in registers between its passes and the statistics reduced by shuffles
// (one read of each input, no block barriers); wider rows take one block per row (statistics by block
// reductions, rows re-read through L1/L2; a warp-per-row dx measured slower on H200). The backward of rows up
// to 8192 wide is one kernel per chunk of rows (dx and the dgamma/dbeta partial sums from one read), then
// the chunks' partials summed in order. dgamma/dbeta: a
// two-stage column reduction (fixed chunks of rows, then chunks summed in order: deterministic).
#include <algorithm>
#include <stdexcept>
#include <utility>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/kernel_utils.cuh"
#include "executor/cuda/norm_kernels.h"

namespace megatune::executor::cuda {
namespace {

using detail::Bf16x8;

// y = (x - mean) * rstd * gamma + beta for one 8-element vector v of a row (beta_v null: no shift, RMSNorm's
// mean 0). Every forward kernel and the recompute from saved statistics write their output through this one
// expression, so their bits match.
__device__ __forceinline__ Bf16x8 normalized(float (&a)[8], float mean, float rstd, const Bf16x8* gamma_v,
                                             const Bf16x8* beta_v, int64_t v) {
  float g[8], b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  detail::unpack(gamma_v[v], g);
  if (beta_v) detail::unpack(beta_v[v], b);
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = (a[i] - mean) * rstd * g[i] + b[i];
  return detail::pack(a);
}
// Rows per dgamma/dbeta partial (one block of the fused backward): 16 gives 512 blocks on 8192 rows, four
// per multiprocessor, enough to keep the per-row barriers off the critical path.
constexpr int64_t kRowsPerChunk = 16;

int threads_for(int64_t hidden) {
  const int64_t vectors = hidden / 8;
  if (vectors >= 1024) return 512;
  if (vectors >= 256) return 256;
  return 128;
}

__global__ void norm_forward_kernel(bool layer_norm, const bf16* x, const bf16* residual, const bf16* gamma,
                                    const bf16* beta, bf16* y, bf16* sum_out, float* mean_out,
                                    float* rstd_out, int64_t hidden, float eps) {
  const int64_t row = blockIdx.x;
  const int64_t vectors = hidden / 8;
  const auto* x_row = reinterpret_cast<const Bf16x8*>(x + row * hidden);
  const auto* res_row = residual ? reinterpret_cast<const Bf16x8*>(residual + row * hidden) : nullptr;
  auto* sum_row = (residual && sum_out) ? reinterpret_cast<Bf16x8*>(sum_out + row * hidden) : nullptr;
  // Pass 1: input (x + residual, rounded to bf16 as stored) and its sum.
  float total = 0.0f;
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    float a[8];
    detail::unpack(x_row[v], a);
    if (res_row) {
      float b[8];
      detail::unpack(res_row[v], b);
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] += b[i];
      const Bf16x8 packed = detail::pack(a);
      detail::unpack(packed, a);
      if (sum_row) sum_row[v] = packed;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) total += a[i];
  }
  // Every thread re-reads exactly the vectors it wrote, so no barrier is needed before re-reading sum_row.
  const auto* in_row = sum_row ? sum_row : x_row;
  float mean = 0.0f;
  if (layer_norm) mean = detail::block_sum(total) / float(hidden);
  auto load_input = [&](int64_t v, float(&a)[8]) {
    if (sum_row || !res_row) {
      detail::unpack(in_row[v], a);
    } else {  // residual fused but the sum is not stored: recompute it
      float b[8];
      detail::unpack(x_row[v], a);
      detail::unpack(res_row[v], b);
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = __bfloat162float(__float2bfloat16_rn(a[i] + b[i]));
    }
  };
  float square = 0.0f;
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    float a[8];
    load_input(v, a);
#pragma unroll
    for (int i = 0; i < 8; ++i) square += (a[i] - mean) * (a[i] - mean);
  }
  const float rstd = rsqrtf(detail::block_sum(square) / float(hidden) + eps);
  if (threadIdx.x == 0) {
    if (mean_out) mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  const auto* gamma_v = reinterpret_cast<const Bf16x8*>(gamma);
  const auto* beta_v = (layer_norm && beta) ? reinterpret_cast<const Bf16x8*>(beta) : nullptr;
  auto* y_row = reinterpret_cast<Bf16x8*>(y + row * hidden);
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    float a[8];
    load_input(v, a);
    y_row[v] = normalized(a, mean, rstd, gamma_v, beta_v, v);
  }
}

constexpr int kWarpRowsPerBlock = 8;  // warp-per-row kernels: 256 threads

// Forward with one warp per row: lane l holds vectors l, l + 32, ... (VPL of them) of the row.
// (Register cap: at least 4 blocks of 8 rows per multiprocessor, 3 for rows of 2048+ (their whole row and
// residual are in registers), so that enough rows are in flight.)
template <int VPL>
__global__ void __launch_bounds__(32 * kWarpRowsPerBlock, VPL == 8 ? 3 : 4)
    norm_forward_warp_kernel(bool layer_norm, const bf16* x, const bf16* residual, const bf16* gamma,
                             const bf16* beta, bf16* y, bf16* sum_out, float* mean_out, float* rstd_out,
                             int64_t rows, int64_t hidden, float eps) {
  const int64_t row = int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const int64_t vectors = hidden / 8;
  const auto* x_row = reinterpret_cast<const Bf16x8*>(x + row * hidden);
  const auto* res_row = residual ? reinterpret_cast<const Bf16x8*>(residual + row * hidden) : nullptr;
  auto* sum_row = (residual && sum_out) ? reinterpret_cast<Bf16x8*>(sum_out + row * hidden) : nullptr;
  // The input (x + residual, rounded to bf16 as stored) stays packed: 4 registers per 8 values, so that
  // enough rows are in flight per multiprocessor.
  Bf16x8 in[VPL];
  float total = 0.0f;
  // Every load of the row is issued before the first store (sum_out may alias x, so a store in between
  // would order the loads after it).
  Bf16x8 res[VPL];
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    const int64_t v = lane + 32 * j;
    if (v >= vectors) continue;
    in[j] = x_row[v];
    if (res_row) res[j] = res_row[v];
  }
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    const int64_t v = lane + 32 * j;
    if (v >= vectors) continue;
    float a[8];
    detail::unpack(in[j], a);
    if (res_row) {
      float b[8];
      detail::unpack(res[j], b);
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] += b[i];
      in[j] = detail::pack(a);
      detail::unpack(in[j], a);
      if (sum_row) sum_row[v] = in[j];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) total += a[i];
  }
  const float mean = layer_norm ? detail::warp_sum(total) / float(hidden) : 0.0f;
  float square = 0.0f;
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    if (lane + 32 * j >= vectors) continue;
    float a[8];
    detail::unpack(in[j], a);
#pragma unroll
    for (int i = 0; i < 8; ++i) square += (a[i] - mean) * (a[i] - mean);
  }
  const float rstd = rsqrtf(detail::warp_sum(square) / float(hidden) + eps);
  if (lane == 0) {
    if (mean_out) mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  const auto* gamma_v = reinterpret_cast<const Bf16x8*>(gamma);
  const auto* beta_v = (layer_norm && beta) ? reinterpret_cast<const Bf16x8*>(beta) : nullptr;
  auto* y_row = reinterpret_cast<Bf16x8*>(y + row * hidden);
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    const int64_t v = lane + 32 * j;
    if (v >= vectors) continue;
    float a[8];
    detail::unpack(in[j], a);
    y_row[v] = normalized(a, mean, rstd, gamma_v, beta_v, v);
  }
}

// Vectors per lane of the warp-per-row forward for this width (a power of two up to 8), or 0: block kernel.
int warp_vectors_per_lane(int64_t hidden) {
  const int64_t per_lane = (hidden / 8 + 31) / 32;
  for (int vpl : {1, 2, 4, 8})
    if (per_lane <= vpl) return vpl;
  return 0;
}

__global__ void norm_backward_dx_kernel(bool layer_norm, const bf16* dy, const bf16* input, const bf16* gamma,
                                        const float* mean_in, const float* rstd_in, const bf16* d_residual,
                                        bf16* dx, int64_t hidden) {
  const int64_t row = blockIdx.x;
  const int64_t vectors = hidden / 8;
  const auto* dy_row = reinterpret_cast<const Bf16x8*>(dy + row * hidden);
  const auto* in_row = reinterpret_cast<const Bf16x8*>(input + row * hidden);
  const auto* gamma_v = reinterpret_cast<const Bf16x8*>(gamma);
  const float mean = layer_norm ? mean_in[row] : 0.0f, rstd = rstd_in[row];
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    float d[8], a[8], g[8];
    detail::unpack(dy_row[v], d);
    detail::unpack(in_row[v], a);
    detail::unpack(gamma_v[v], g);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float gi = d[i] * g[i];
      sum_g += gi;
      sum_g_xhat += gi * (a[i] - mean) * rstd;
    }
  }
  const float mean_g = layer_norm ? detail::block_sum(sum_g) / float(hidden) : 0.0f;
  const float mean_g_xhat = detail::block_sum(sum_g_xhat) / float(hidden);
  const auto* res_row = d_residual ? reinterpret_cast<const Bf16x8*>(d_residual + row * hidden) : nullptr;
  auto* dx_row = reinterpret_cast<Bf16x8*>(dx + row * hidden);
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    float d[8], a[8], g[8], r[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    detail::unpack(dy_row[v], d);
    detail::unpack(in_row[v], a);
    detail::unpack(gamma_v[v], g);
    if (res_row) detail::unpack(res_row[v], r);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float xhat = (a[i] - mean) * rstd;
      a[i] = rstd * (d[i] * g[i] - mean_g - xhat * mean_g_xhat) + r[i];
    }
    dx_row[v] = detail::pack(a);
  }
}

// Sums of two values over the block (256 threads at most): warp sums to scratch[parity], one barrier, then
// every thread adds the warp sums in warp order (the same bits everywhere). Calls alternate between two
// buffers (parity), so a buffer is only rewritten after every thread has passed the next call's barrier,
// that is, after it read this call's sums.
__device__ __forceinline__ float2 block_sum2(float a, float b, float2 (*scratch)[8], int parity) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  a = detail::warp_sum(a);
  b = detail::warp_sum(b);
  if (lane == 0) scratch[parity][warp] = make_float2(a, b);
  __syncthreads();
  float2 total = scratch[parity][0];
  for (int w = 1; w < warps; ++w) {
    const float2 y = scratch[parity][w];
    total.x += y.x;
    total.y += y.y;
  }
  return total;
}

// The whole backward of one chunk of kRowsPerChunk rows in one block: thread t owns vectors t, t + 256, ...
// (VPT of them) of every row, keeps gamma and its dgamma/dbeta partial sums in registers, and walks the
// rows in order. Each row's dy, input and d_residual vectors arrive through a ring of kDepth(VPT) row slots
// in shared memory filled by cp.async (row r + depth is requested as soon as row r is in registers), so
// several rows' loads are in flight while one row's statistics reduce across the block; a thread reads
// back only what it copied itself, so the ring needs no barriers. Reads everything once; dgamma/dbeta
// partials as the separate partial kernel (same order of additions).
constexpr int fused_depth(int vpt) { return vpt == 1 ? 4 : 2; }
constexpr size_t fused_smem_bytes(int vpt) {
  return size_t(fused_depth(vpt)) * 3 * vpt * 256 * sizeof(Bf16x8);
}

template <int VPT>
__global__ void __launch_bounds__(256, VPT == 1 ? 3 : 1)  // one vector per thread: three blocks per SM
    norm_backward_fused_kernel(bool layer_norm, const bf16* dy, const bf16* input, const bf16* gamma,
                               const float* mean_in, const float* rstd_in, const bf16* d_residual, bf16* dx,
                               float* partial_gamma, float* partial_beta, int64_t rows, int64_t hidden) {
  constexpr int kDepth = fused_depth(VPT);
  extern __shared__ Bf16x8 ring[];  // [kDepth][3 (dy, input, d_residual)][VPT][256]
  __shared__ float2 scratch[2][8];
  __shared__ float row_mean[kRowsPerChunk], row_rstd[kRowsPerChunk];
  const int64_t vectors = hidden / 8;
  const int64_t chunk = blockIdx.x;
  const int64_t r0 = chunk * kRowsPerChunk, r1 = min(rows, r0 + kRowsPerChunk);
  const int n = int(r1 - r0);
  // This thread's vectors: row i of the chunk at offset i * vectors from these.
  const auto* dy_v = reinterpret_cast<const Bf16x8*>(dy + r0 * hidden) + threadIdx.x;
  const auto* in_v = reinterpret_cast<const Bf16x8*>(input + r0 * hidden) + threadIdx.x;
  const auto* res_g =
      d_residual ? reinterpret_cast<const Bf16x8*>(d_residual + r0 * hidden) + threadIdx.x : nullptr;
  auto slot = [&](int i, int which, int j) -> Bf16x8* {
    return ring + (((i % kDepth) * 3 + which) * VPT + j) * 256 + threadIdx.x;
  };
  auto request_row = [&](int i) {  // one commit group per row, empty past the chunk
    if (i < n) {
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        if (threadIdx.x + 256 * j >= vectors) continue;
        const int64_t at = int64_t(i) * vectors + 256 * j;
        detail::cp_async_16(slot(i, 0, j), dy_v + at, true);
        detail::cp_async_16(slot(i, 1, j), in_v + at, true);
        if (res_g) detail::cp_async_16(slot(i, 2, j), res_g + at, true);
      }
    }
    detail::cp_async_commit();
  };
#pragma unroll
  for (int k = 0; k < kDepth; ++k) request_row(k);
  if (threadIdx.x < n) {
    row_mean[threadIdx.x] = layer_norm ? mean_in[r0 + threadIdx.x] : 0.0f;
    row_rstd[threadIdx.x] = rstd_in[r0 + threadIdx.x];
  }
  float g[VPT][8], acc_gamma[VPT][8], acc_beta[VPT][8];
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int64_t v = threadIdx.x + 256 * j;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc_gamma[j][i] = acc_beta[j][i] = g[j][i] = 0.0f;
    if (v < vectors) detail::unpack(reinterpret_cast<const Bf16x8*>(gamma)[v], g[j]);
  }
  __syncthreads();  // row statistics
  for (int i = 0; i < n; ++i) {
    detail::cp_async_wait<kDepth - 1>();  // row i's group (the oldest outstanding) has landed
    Bf16x8 d_v[VPT], a_v[VPT], res_v[VPT];
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      if (threadIdx.x + 256 * j >= vectors) continue;
      d_v[j] = *slot(i, 0, j);
      a_v[j] = *slot(i, 1, j);
      if (res_g) res_v[j] = *slot(i, 2, j);
    }
    request_row(i + kDepth);  // into the slot just read
    const float mean = row_mean[i], rstd = row_rstd[i];
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      if (threadIdx.x + 256 * j >= vectors) continue;
      float d[8], a[8];
      detail::unpack(d_v[j], d);
      detail::unpack(a_v[j], a);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float ge = d[e] * g[j][e];
        sum_g += ge;
        sum_g_xhat += ge * (a[e] - mean) * rstd;
        acc_gamma[j][e] += d[e] * (a[e] - mean) * rstd;
        acc_beta[j][e] += d[e];
      }
    }
    const float2 total = block_sum2(sum_g, sum_g_xhat, scratch, i & 1);
    const float mean_g = layer_norm ? total.x / float(hidden) : 0.0f;
    const float mean_g_xhat = total.y / float(hidden);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int64_t v = threadIdx.x + 256 * j;
      if (v >= vectors) continue;
      float d[8], a[8], res[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      detail::unpack(d_v[j], d);
      detail::unpack(a_v[j], a);
      if (res_g) detail::unpack(res_v[j], res);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float xhat = (a[e] - mean) * rstd;
        a[e] = rstd * (d[e] * g[j][e] - mean_g - xhat * mean_g_xhat) + res[e];
      }
      reinterpret_cast<Bf16x8*>(dx + (r0 + i) * hidden)[v] = detail::pack(a);
    }
  }
  detail::cp_async_wait<0>();
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int64_t v = threadIdx.x + 256 * j;
    if (v >= vectors) continue;
    auto* pg = reinterpret_cast<float4*>(partial_gamma + chunk * hidden + v * 8);
    auto* pb = reinterpret_cast<float4*>(partial_beta + chunk * hidden + v * 8);
    pg[0] = make_float4(acc_gamma[j][0], acc_gamma[j][1], acc_gamma[j][2], acc_gamma[j][3]);
    pg[1] = make_float4(acc_gamma[j][4], acc_gamma[j][5], acc_gamma[j][6], acc_gamma[j][7]);
    pb[0] = make_float4(acc_beta[j][0], acc_beta[j][1], acc_beta[j][2], acc_beta[j][3]);
    pb[1] = make_float4(acc_beta[j][4], acc_beta[j][5], acc_beta[j][6], acc_beta[j][7]);
  }
}

// Stage 1: partial sums over a chunk of kRowsPerChunk rows of dy * xhat and dy, 8 columns per thread.
__global__ void norm_backward_partial_kernel(bool layer_norm, const bf16* dy, const bf16* input,
                                             const float* mean_in, const float* rstd_in, float* partial_gamma,
                                             float* partial_beta, int64_t rows, int64_t hidden) {
  const int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;  // vector (8 columns) index
  if (v >= hidden / 8) return;
  const int64_t chunk = blockIdx.y;
  const int64_t row_end = min(rows, (chunk + 1) * kRowsPerChunk);
  float acc_gamma[8] = {0, 0, 0, 0, 0, 0, 0, 0}, acc_beta[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t r = chunk * kRowsPerChunk; r < row_end; ++r) {
    float d[8], a[8];
    detail::unpack(reinterpret_cast<const Bf16x8*>(dy + r * hidden)[v], d);
    detail::unpack(reinterpret_cast<const Bf16x8*>(input + r * hidden)[v], a);
    const float mean = layer_norm ? mean_in[r] : 0.0f, rstd = rstd_in[r];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      acc_gamma[i] += d[i] * (a[i] - mean) * rstd;
      acc_beta[i] += d[i];
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    partial_gamma[chunk * hidden + v * 8 + i] = acc_gamma[i];
    partial_beta[chunk * hidden + v * 8 + i] = acc_beta[i];
  }
}

// y = norm(x) from statistics the forward stored (a recompute): one 8-element vector per thread and step,
// through the forward kernels' normalized(), so the bits match theirs.
__global__ void norm_apply_kernel(bool layer_norm, const bf16* x, const bf16* gamma, const bf16* beta,
                                  const float* mean_in, const float* rstd_in, bf16* y, int64_t rows,
                                  int64_t hidden) {
  const int64_t vectors = hidden / 8, total = rows * vectors;
  const auto* x_v = reinterpret_cast<const Bf16x8*>(x);
  const auto* gamma_v = reinterpret_cast<const Bf16x8*>(gamma);
  const auto* beta_v = (layer_norm && beta) ? reinterpret_cast<const Bf16x8*>(beta) : nullptr;
  auto* y_v = reinterpret_cast<Bf16x8*>(y);
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / vectors, v = idx % vectors;
    const float mean = layer_norm ? mean_in[row] : 0.0f, rstd = rstd_in[row];
    float a[8];
    detail::unpack(x_v[idx], a);
    y_v[idx] = normalized(a, mean, rstd, gamma_v, beta_v, v);
  }
}

void check_pointers(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (p != nullptr && !detail::aligned16(p))
      throw std::invalid_argument("norm kernels: pointers must be 16-byte aligned");
}

}  // namespace

bool norm_supports(int64_t hidden) { return hidden > 0 && hidden % 8 == 0 && hidden <= 32768; }

void norm_forward(NormKind kind, const bf16* x, const bf16* residual, const bf16* gamma, const bf16* beta,
                  bf16* y, bf16* sum_out, float* mean, float* rstd, int64_t rows, int64_t hidden, float eps,
                  cudaStream_t stream) {
  if (!norm_supports(hidden))
    throw std::invalid_argument("norm_forward: hidden must be a multiple of 8, <= 32768");
  if (rows <= 0) return;
  const bool layer_norm = kind == NormKind::kLayerNorm;
  if (layer_norm && mean == nullptr) throw std::invalid_argument("norm_forward: LayerNorm needs mean");
  check_pointers({x, residual, gamma, beta, y, sum_out});
  if (const int vpl = warp_vectors_per_lane(hidden); vpl > 0) {
    const auto warp_kernel = vpl == 1   ? norm_forward_warp_kernel<1>
                             : vpl == 2 ? norm_forward_warp_kernel<2>
                             : vpl == 4 ? norm_forward_warp_kernel<4>
                                        : norm_forward_warp_kernel<8>;
    warp_kernel<<<unsigned((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock), 32 * kWarpRowsPerBlock, 0,
                  stream>>>(layer_norm, x, residual, gamma, beta, y, sum_out, mean, rstd, rows, hidden, eps);
  } else {
    norm_forward_kernel<<<unsigned(rows), threads_for(hidden), 0, stream>>>(
        layer_norm, x, residual, gamma, beta, y, sum_out, mean, rstd, hidden, eps);
  }
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

void norm_apply(NormKind kind, const bf16* x, const bf16* gamma, const bf16* beta, const float* mean,
                const float* rstd, bf16* y, int64_t rows, int64_t hidden, cudaStream_t stream) {
  if (!norm_supports(hidden))
    throw std::invalid_argument("norm_apply: hidden must be a multiple of 8, <= 32768");
  if (rows <= 0) return;
  const bool layer_norm = kind == NormKind::kLayerNorm;
  if (layer_norm && mean == nullptr) throw std::invalid_argument("norm_apply: LayerNorm needs mean");
  check_pointers({x, gamma, beta, y});
  norm_apply_kernel<<<detail::grid_for(rows * (hidden / 8), 256), 256, 0, stream>>>(
      layer_norm, x, gamma, beta, mean, rstd, y, rows, hidden);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

size_t norm_backward_workspace_bytes(int64_t rows, int64_t hidden) {
  return 2 * size_t((rows + kRowsPerChunk - 1) / kRowsPerChunk) * size_t(hidden) * sizeof(float);
}

void norm_backward(NormKind kind, const bf16* dy, const bf16* input, const bf16* gamma, const float* mean,
                   const float* rstd, const bf16* d_residual, bf16* dx, float* dgamma, float* dbeta,
                   int64_t rows, int64_t hidden, bool accumulate, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream, NormBackwardKernel kernel) {
  if (!norm_supports(hidden))
    throw std::invalid_argument("norm_backward: hidden must be a multiple of 8, <= 32768");
  if (workspace_bytes < norm_backward_workspace_bytes(rows, hidden))
    throw std::invalid_argument("norm_backward: workspace smaller than norm_backward_workspace_bytes()");
  if (rows <= 0) return;
  const bool layer_norm = kind == NormKind::kLayerNorm;
  check_pointers({dy, input, gamma, d_residual, dx});
  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  auto* partial_gamma = static_cast<float*>(workspace);
  float* partial_beta = partial_gamma + chunks * hidden;
  const int64_t vectors = hidden / 8;
  if (kernel == NormBackwardKernel::kFused && vectors <= 4 * 256) {
    const int vpt = vectors <= 256 ? 1 : vectors <= 512 ? 2 : 4;
    const unsigned threads = unsigned(std::min<int64_t>(256, (vectors + 31) / 32 * 32));
    const auto fused_kernel = vpt == 1   ? norm_backward_fused_kernel<1>
                              : vpt == 2 ? norm_backward_fused_kernel<2>
                                         : norm_backward_fused_kernel<4>;
    const size_t smem = fused_smem_bytes(vpt);
    static const bool raised = [] {  // the rings exceed the 48 KiB default together with the static arrays
      using Kernel = decltype(&norm_backward_fused_kernel<1>);
      const std::pair<Kernel, int> kernels[] = {{norm_backward_fused_kernel<1>, 1},
                                                {norm_backward_fused_kernel<2>, 2},
                                                {norm_backward_fused_kernel<4>, 4}};
      for (const auto& [k, v] : kernels)
        MEGATUNE_CUDA_CHECK(
            cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(fused_smem_bytes(v))));
      return true;
    }();
    (void)raised;
    fused_kernel<<<unsigned(chunks), threads, smem, stream>>>(
        layer_norm, dy, input, gamma, mean, rstd, d_residual, dx, partial_gamma, partial_beta, rows, hidden);
    MEGATUNE_CUDA_CHECK_LAUNCH();
    detail::column_reduce<>(partial_gamma, partial_beta, dgamma, layer_norm ? dbeta : nullptr, chunks, hidden,
                            accumulate, stream);
    MEGATUNE_CUDA_CHECK_LAUNCH();
    return;
  }
  // The partial sums read dy before dx overwrites it (dx may alias d_residual, never dy).
  const unsigned vector_blocks = unsigned((hidden / 8 + 127) / 128);
  norm_backward_partial_kernel<<<dim3(vector_blocks, unsigned(chunks)), 128, 0, stream>>>(
      layer_norm, dy, input, mean, rstd, partial_gamma, partial_beta, rows, hidden);
  MEGATUNE_CUDA_CHECK_LAUNCH();
  detail::column_reduce<>(partial_gamma, partial_beta, dgamma, layer_norm ? dbeta : nullptr, chunks, hidden,
                          accumulate, stream);
  MEGATUNE_CUDA_CHECK_LAUNCH();
  norm_backward_dx_kernel<<<unsigned(rows), threads_for(hidden), 0, stream>>>(
      layer_norm, dy, input, gamma, mean, rstd, d_residual, dx, hidden);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace megatune::executor::cuda
