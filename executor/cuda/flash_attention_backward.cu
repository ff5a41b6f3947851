// Flash attention backward (FlashAttention-2): delta = rowsum(dO o O) first; then a block owns 64 or 128 key
// rows of one (batch, kv head), one warp per 16 rows, and walks the query tiles of every head in its group:
// it recomputes P^T = exp(S^T - lse) from K Q^T, forms dS^T = P^T o (V dO^T - delta), accumulates
// dV += P^T dO and dK += dS^T Q in registers (GQA sums over the group for free), and adds dQ += dS K into an
// fp32 buffer with atomics (warps split dQ's query rows x head-dim columns); a last pass scales and converts
// dQ to bf16. 128 key rows per block halve the Q/dO tile loads and the dQ atomics per key row; warps whose
// key rows all lie above a causal query tile skip its matrix products. Blocks launch longest first under a
// causal mask (every head's key block 0 before any key block 1), which shortens the tail.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/flash_attention.h"
#include "executor/cuda/flash_attention_common.cuh"
#include "executor/cuda/flash_attention_hopper.h"
#include "executor/cuda/kernel_utils.cuh"

namespace megatune::executor::cuda {
namespace {

using namespace flash;

constexpr int kBlockM = 64;  // query rows per step

struct BackwardParams {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  const bf16* d_o;
  const float* lse;    // [b, n_q, s]
  const float* delta;  // [b, n_q, s]
  float* dq_accum;     // [b, s, n_q, d]
  bf16* dk;
  bf16* dv;
  int64_t q_stride, kv_stride, o_stride;
  int seq_len, num_heads, heads_per_group;
  float scale, scale_log2;
  bool causal;
  bool longest_first;  // grid (kv heads, batch, key blocks): key block 0 (the most causal work) first
};

template <int D, int BLOCK_N>
constexpr int backward_smem_bytes() {
  return (2 * BLOCK_N * D + 4 * kBlockM * D + kBlockM * BLOCK_N) * int(sizeof(bf16));
}

// delta[b, h, i] = sum_d dO[b, i, h, d] * O[b, i, h, d], and the row's dQ accumulator zeroed (row layout
// [b, s, n_q, d], or the tiled layout of hopper::dq_tile_offset when dq_tiled): D / 8 lanes per (token, head)
// row, 16-byte loads (a warp takes 32 / (D / 8) rows), sums reduced within the lane group. The block size is
// a multiple of 32.
template <int D>
__global__ void flash_backward_preprocess_kernel(const bf16* o, const bf16* d_o, const float* lse,
                                                 float* delta, float* lse_log2, float* dq_accum,
                                                 bool dq_tiled, int64_t o_stride, int seq_len, int num_heads,
                                                 int64_t rows) {
  constexpr int kLanesPerRow = D / 8;
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanesPerRow;
  const int part = threadIdx.x % kLanesPerRow;
  const bool valid = row < rows;  // no early exit: the whole warp takes part in the shuffles
  const int64_t token = valid ? row / num_heads : 0;
  const int head = valid ? int(row % num_heads) : 0;
  const int64_t at_o = token * o_stride + int64_t(head) * D + 8 * part;
  float a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (valid) {
    detail::unpack(*reinterpret_cast<const detail::Bf16x8*>(o + at_o), a);
    detail::unpack(*reinterpret_cast<const detail::Bf16x8*>(d_o + at_o), b);
  }
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) sum += a[i] * b[i];
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (!valid) return;
  const int64_t batch = token / seq_len, position = token % seq_len;
  // Tiled: the row's 8 columns are two 16-byte chunks of row position % 64 of a tile (zeroing ignores the
  // swizzle: the row's chunks are all zeroed by its D / 8 lanes either way).
  float* const zero_at = dq_tiled ? dq_accum +
                                        hopper::dq_tile_offset(batch, head, position / 64, (8 * part) / 64,
                                                               num_heads, seq_len, D) +
                                        (position % 64) * 64 + (8 * part) % 64
                                  : dq_accum + row * D + 8 * part;
  float4* zero = reinterpret_cast<float4*>(zero_at);
  zero[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  zero[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (part == 0) {
    const int64_t at = (batch * num_heads + head) * seq_len + position;
    delta[at] = sum;
    if (lse_log2 != nullptr) lse_log2[at] = lse[at] * kLog2e;  // the wgmma kernel's exponent offset
  }
}

// BLOCK_N key rows per block (64: 4 warps, 2 blocks per SM; 128: 8 warps, 1 block per SM).
template <int D, int BLOCK_N>
__global__ void __launch_bounds__(BLOCK_N * 2, BLOCK_N == 64 ? 2 : 1)
    flash_backward_kernel(const BackwardParams p) {
  constexpr int kBlockN = BLOCK_N;
  constexpr int kWarps = BLOCK_N / 16;
  constexpr int kThreads = kWarps * 32;
  constexpr int kQueryGroups = kBlockM / 16;            // dQ phase: warps per 16-row query slab ...
  constexpr int kColumnSplits = kWarps / kQueryGroups;  // ... times head-dim column splits
  constexpr int kDpairsPerWarp = D / 16 / kColumnSplits;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* k_tile = reinterpret_cast<bf16*>(smem_raw);  // [kBlockN][D]
  bf16* v_tile = k_tile + kBlockN * D;               // [kBlockN][D]
  bf16* q_tiles = v_tile + kBlockN * D;              // [2][kBlockM][D]
  bf16* do_tiles = q_tiles + 2 * kBlockM * D;        // [2][kBlockM][D]
  bf16* ds_tile = do_tiles + 2 * kBlockM * D;        // [kBlockM (q)][kBlockN (kv)], swizzled rows

  const int n_block = p.longest_first ? blockIdx.z : blockIdx.x;
  const int group = p.longest_first ? blockIdx.x : blockIdx.y;
  const int batch = p.longest_first ? blockIdx.y : blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kv0 = n_block * kBlockN;
  const int64_t batch_token0 = int64_t(batch) * p.seq_len;

  const bf16* k_base = p.k + batch_token0 * p.kv_stride + int64_t(group) * D;
  const bf16* v_base = p.v + batch_token0 * p.kv_stride + int64_t(group) * D;
  load_tile<kBlockN, D, kThreads>(k_tile, k_base, p.kv_stride, kv0, p.seq_len);
  load_tile<kBlockN, D, kThreads>(v_tile, v_base, p.kv_stride, kv0, p.seq_len);

  const int m_tiles = (p.seq_len + kBlockM - 1) / kBlockM;
  const int m_first = p.causal ? kv0 / kBlockM : 0;
  const int per_head = m_tiles - m_first;
  const int iterations = per_head * p.heads_per_group;

  auto issue_loads = [&](int it, int buffer) {
    const int head = group * p.heads_per_group + it / per_head;
    const int q0 = (m_first + it % per_head) * kBlockM;
    load_tile<kBlockM, D, kThreads>(q_tiles + buffer * kBlockM * D,
                                    p.q + batch_token0 * p.q_stride + int64_t(head) * D, p.q_stride, q0,
                                    p.seq_len);
    load_tile<kBlockM, D, kThreads>(do_tiles + buffer * kBlockM * D,
                                    p.d_o + batch_token0 * p.o_stride + int64_t(head) * D, p.o_stride, q0,
                                    p.seq_len);
  };
  if (iterations > 0) issue_loads(0, 0);
  cp_async_commit();

  float dv_acc[D / 8][4], dk_acc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dv_acc[i][e] = dk_acc[i][e] = 0.0f;
  }
  const int my_kv[2] = {kv0 + warp * 16 + (lane >> 2), kv0 + warp * 16 + (lane >> 2) + 8};

  for (int it = 0; it < iterations; ++it) {
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < iterations) issue_loads(it + 1, (it + 1) & 1);
    cp_async_commit();
    const int head = group * p.heads_per_group + it / per_head;
    const int q0 = (m_first + it % per_head) * kBlockM;
    const bf16* q_tile = q_tiles + (it & 1) * kBlockM * D;
    const bf16* do_tile = do_tiles + (it & 1) * kBlockM * D;
    const int64_t stats0 = (int64_t(batch) * p.num_heads + head) * p.seq_len;

    // A warp whose 16 key rows all lie after the tile's last query sees only masked entries: P = dS = 0.
    const bool warp_masked = p.causal && kv0 + warp * 16 > q0 + kBlockM - 1;

    // S^T = K_w Q^T and dP^T = V_w dO^T (16 key rows x 64 query columns per warp).
    float s[kBlockM / 8][4], dp[kBlockM / 8][4];
#pragma unroll
    for (int n = 0; n < kBlockM / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      if (warp_masked) break;
      uint32_t a_k[4], a_v[4];
      load_a<D>(a_k, k_tile, warp * 16, kk * 16);
      load_a<D>(a_v, v_tile, warp * 16, kk * 16);
#pragma unroll
      for (int np = 0; np < kBlockM / 16; ++np) {
        uint32_t b[4];
        load_b_nk<D>(b, q_tile, np * 16, kk * 16);
        mma(s[2 * np], a_k, b[0], b[1]);
        mma(s[2 * np + 1], a_k, b[2], b[3]);
        load_b_nk<D>(b, do_tile, np * 16, kk * 16);
        mma(dp[2 * np], a_v, b[0], b[1]);
        mma(dp[2 * np + 1], a_v, b[2], b[3]);
      }
    }
    // P^T and dS^T in place (s <- P^T, dp <- dS^T).
#pragma unroll
    for (int n = 0; n < kBlockM / 8; ++n) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int q = q0 + n * 8 + 2 * (lane & 3) + c;
        const bool q_valid = q < p.seq_len;
        const float lse_log2 = q_valid ? __ldg(p.lse + stats0 + q) * kLog2e : 0.0f;
        const float delta = q_valid ? __ldg(p.delta + stats0 + q) : 0.0f;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int e = 2 * r + c;
          const bool visible = q_valid && !(p.causal && q < my_kv[r]);
          const float prob = visible ? fast_exp2(fmaf(s[n][e], p.scale_log2, -lse_log2)) : 0.0f;
          s[n][e] = prob;
          dp[n][e] = prob * (dp[n][e] - delta);
        }
      }
    }
    // dV += P^T dO and dK += dS^T Q (k = query rows).
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      if (warp_masked) break;
      uint32_t a_p[4], a_ds[4];
      a_p[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      a_p[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      a_p[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a_p[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      a_ds[0] = pack_bf16(dp[2 * kk][0], dp[2 * kk][1]);
      a_ds[1] = pack_bf16(dp[2 * kk][2], dp[2 * kk][3]);
      a_ds[2] = pack_bf16(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
      a_ds[3] = pack_bf16(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
#pragma unroll
      for (int dpair = 0; dpair < D / 16; ++dpair) {
        uint32_t b[4];
        load_b_kn<D>(b, do_tile, kk * 16, dpair * 16);
        mma(dv_acc[2 * dpair], a_p, b[0], b[1]);
        mma(dv_acc[2 * dpair + 1], a_p, b[2], b[3]);
        load_b_kn<D>(b, q_tile, kk * 16, dpair * 16);
        mma(dk_acc[2 * dpair], a_ds, b[0], b[1]);
        mma(dk_acc[2 * dpair + 1], a_ds, b[2], b[3]);
      }
    }
    // dS (query-major) to shared memory for dQ = dS K.
#pragma unroll
    for (int n = 0; n < kBlockM / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int q_local = n * 8 + 2 * (lane & 3) + (e & 1);
        const int kv_local = warp * 16 + (lane >> 2) + 8 * (e >> 1);
        ds_tile[swizzled<kBlockN>(q_local, kv_local >> 3) + (kv_local & 7)] = __float2bfloat16_rn(dp[n][e]);
      }
    }
    __syncthreads();
    // dQ = dS K: this warp's 16 query rows x kDpairsPerWarp * 16 head-dim columns.
    const int query_group = warp % kQueryGroups, dpair0 = (warp / kQueryGroups) * kDpairsPerWarp;
    uint32_t a_ds[kBlockN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) load_a<kBlockN>(a_ds[kk], ds_tile, query_group * 16, kk * 16);
    const int q_row[2] = {q0 + query_group * 16 + (lane >> 2), q0 + query_group * 16 + (lane >> 2) + 8};
#pragma unroll
    for (int dpair = dpair0; dpair < dpair0 + kDpairsPerWarp; ++dpair) {
      float acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t b[4];
        load_b_kn<D>(b, k_tile, kk * 16, dpair * 16);
        mma(acc[0], a_ds[kk], b[0], b[1]);
        mma(acc[1], a_ds[kk], b[2], b[3]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (q_row[r] >= p.seq_len) continue;
          float* dst = p.dq_accum + ((batch_token0 + q_row[r]) * p.num_heads + head) * D + dpair * 16 +
                       h * 8 + 2 * (lane & 3);
          atomicAdd(reinterpret_cast<float2*>(dst), make_float2(acc[h][2 * r], acc[h][2 * r + 1]));
        }
      }
    }
  }

  // Store dK (scaled) and dV for this block's key rows.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int kv = my_kv[r];
    if (kv >= p.seq_len) continue;
    bf16* dk_row = p.dk + (batch_token0 + kv) * p.kv_stride + int64_t(group) * D;
    bf16* dv_row = p.dv + (batch_token0 + kv) * p.kv_stride + int64_t(group) * D;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const int col = i * 8 + 2 * (lane & 3);
      *reinterpret_cast<__nv_bfloat162*>(dk_row + col) =
          __floats2bfloat162_rn(dk_acc[i][2 * r] * p.scale, dk_acc[i][2 * r + 1] * p.scale);
      *reinterpret_cast<__nv_bfloat162*>(dv_row + col) =
          __floats2bfloat162_rn(dv_acc[i][2 * r], dv_acc[i][2 * r + 1]);
    }
  }
}

// bf16(scale * x) of 8 fp32 accumulators, packed for one 16-byte store.
__device__ __forceinline__ uint4 scaled_bf16x8(float4 lo, float4 hi, float scale) {
  uint4 out;
  out.x = flash::pack_bf16(lo.x * scale, lo.y * scale);
  out.y = flash::pack_bf16(lo.z * scale, lo.w * scale);
  out.z = flash::pack_bf16(hi.x * scale, hi.y * scale);
  out.w = flash::pack_bf16(hi.z * scale, hi.w * scale);
  return out;
}

// dq[b, i, h, :] = bf16(scale * dq_accum[b, i, h, :]), 8 elements (two 16-byte loads, one 16-byte store)
// per thread and step; a token's n_q * d accumulators are contiguous, its dq row strided.
__global__ void flash_backward_convert_dq_kernel(const float* dq_accum, bf16* dq, int64_t q_stride,
                                                 int64_t vectors_per_token, int64_t vectors, float scale) {
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < vectors;
       v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t token = v / vectors_per_token, within = v % vectors_per_token;
    const float4* in = reinterpret_cast<const float4*>(dq_accum) + 2 * v;
    *reinterpret_cast<uint4*>(dq + token * q_stride + 8 * within) = scaled_bf16x8(in[0], in[1], scale);
  }
}

// The same from the tiled accumulator (hopper::dq_tile_offset): vectors walk the tiles in memory order, 8 per
// 64-float row, so a warp reads 4 whole rows and writes 4 rows' 128 contiguous bytes; rows past the
// sequence's end (the last tile's padding) are skipped.
__global__ void flash_backward_convert_dq_tiles_kernel(const float* dq_accum, bf16* dq, int64_t q_stride,
                                                       int seq_len, int num_heads, int head_dim,
                                                       int64_t vectors, float scale) {
  const int64_t row_blocks = hopper::dq_row_blocks(seq_len), col_blocks = head_dim / 64;
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < vectors;
       v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t tile = v >> 9;
    const int r = int(v >> 3) & 63, m = int(v) & 7;
    const int64_t col_block = tile % col_blocks, rest = tile / col_blocks;
    const int64_t position = (rest % row_blocks) * 64 + r, head_batch = rest / row_blocks;
    if (position >= seq_len) continue;
    const int64_t head = head_batch % num_heads, batch = head_batch / num_heads;
    const float4* row = reinterpret_cast<const float4*>(dq_accum + tile * 4096 + r * 64);
    *reinterpret_cast<uint4*>(dq + (batch * seq_len + position) * q_stride + head * head_dim +
                              col_block * 64 + 8 * m) =
        scaled_bf16x8(row[(2 * m) ^ (r & 7)], row[(2 * m + 1) ^ (r & 7)], scale);
  }
}

size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// fp32 elements of the dQ accumulator: the sequence rounded up to the tiled layout's 64 rows (the row layout
// uses the first b * s * n_q * d of them).
size_t dq_accum_elements(const AttentionShape& shape) {
  return size_t(shape.batch) * size_t(shape.num_heads) * size_t(hopper::dq_row_blocks(shape.seq_q)) * 64 *
         size_t(shape.head_dim);
}

// The main pass for one (head_dim, key rows per block); sets the shared-memory limit on first use.
template <int D, int BLOCK_N>
void launch_backward_main(const AttentionShape& shape, const BackwardParams& params, cudaStream_t stream) {
  constexpr int smem = backward_smem_bytes<D, BLOCK_N>();
  static bool configured = false;
  if (!configured) {
    MEGATUNE_CUDA_CHECK(cudaFuncSetAttribute(flash_backward_kernel<D, BLOCK_N>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = true;
  }
  const unsigned key_blocks = unsigned((shape.seq_q + BLOCK_N - 1) / BLOCK_N);
  const dim3 grid = params.longest_first
                        ? dim3(unsigned(shape.num_kv_heads), unsigned(shape.batch), key_blocks)
                        : dim3(key_blocks, unsigned(shape.num_kv_heads), unsigned(shape.batch));
  flash_backward_kernel<D, BLOCK_N><<<grid, BLOCK_N * 2, smem, stream>>>(params);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace

size_t flash_attention_backward_workspace_bytes(const AttentionShape& shape) {
  const size_t tokens = size_t(shape.batch) * size_t(shape.seq_q);
  // dQ's fp32 accumulator, delta = rowsum(dO o O), and lse in base 2.
  return align256(dq_accum_elements(shape) * sizeof(float)) +
         2 * align256(tokens * size_t(shape.num_heads) * sizeof(float));
}

void flash_attention_backward(const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v,
                              const bf16* o, const float* lse, const bf16* d_o, bf16* dq, bf16* dk, bf16* dv,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  flash_attention_backward_variant(shape, q, k, v, o, lse, d_o, dq, dk, dv, workspace, workspace_bytes,
                                   stream, BackwardVariant{});
}

void flash_attention_backward_variant(const AttentionShape& shape, const bf16* q, const bf16* k,
                                      const bf16* v, const bf16* o, const float* lse, const bf16* d_o,
                                      bf16* dq, bf16* dk, bf16* dv, void* workspace, size_t workspace_bytes,
                                      cudaStream_t stream, BackwardVariant variant) {
  validate_attention_shape(shape);
  const int key_rows_per_block = variant.key_rows_per_block;
  if (key_rows_per_block != 64 && key_rows_per_block != 128)
    throw std::invalid_argument("flash_attention_backward_variant: key_rows_per_block must be 64 or 128");
  if (variant.wgmma_ws_stages != 2 && variant.wgmma_ws_stages != 3)
    throw std::invalid_argument("flash_attention_backward_variant: wgmma_ws_stages must be 2 or 3");
  if (variant.wgmma_warpgroups < 0 || variant.wgmma_warpgroups > 2)
    throw std::invalid_argument("flash_attention_backward_variant: wgmma_warpgroups must be 0, 1 or 2");
  if (!flash_attention_supports(shape))
    throw std::invalid_argument("flash_attention_backward: " + flash_attention_unsupported(shape));
  for (const void* ptr :
       {static_cast<const void*>(q), static_cast<const void*>(k), static_cast<const void*>(v),
        static_cast<const void*>(o), static_cast<const void*>(d_o), static_cast<const void*>(dq),
        static_cast<const void*>(dk), static_cast<const void*>(dv)}) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      throw std::invalid_argument("flash_attention_backward: tensors must be 16-byte aligned");
  }
  if (workspace_bytes < flash_attention_backward_workspace_bytes(shape))
    throw std::invalid_argument("flash_attention_backward: workspace smaller than the queried size");
  const int64_t tokens = shape.batch * shape.seq_q;
  const size_t dq_bytes = dq_accum_elements(shape) * sizeof(float);
  auto* dq_accum = static_cast<float*>(workspace);
  auto* delta = reinterpret_cast<float*>(static_cast<char*>(workspace) + align256(dq_bytes));
  auto* lse_log2 = reinterpret_cast<float*>(
      reinterpret_cast<char*>(delta) + align256(size_t(tokens) * size_t(shape.num_heads) * sizeof(float)));

  BackwardParams params{q,
                        k,
                        v,
                        d_o,
                        lse,
                        delta,
                        dq_accum,
                        dk,
                        dv,
                        shape.q_stride(),
                        shape.k_stride(),
                        shape.o_stride(),
                        int(shape.seq_q),
                        int(shape.num_heads),
                        int(shape.num_heads / shape.num_kv_heads),
                        shape.scale(),
                        shape.scale() * kLog2e,
                        shape.causal,
                        variant.longest_first};
  const int64_t rows = tokens * shape.num_heads;
  const int wgmma_warpgroups = variant.wgmma_warpgroups != 0 ? variant.wgmma_warpgroups : 2;
  const bool warp_specialized =
      variant.wgmma && variant.wgmma_warp_specialized && hopper::warp_specialized_takes(tokens);
  const bool dq_tiled =
      variant.wgmma && (warp_specialized || wgmma_warpgroups == 2) && variant.wgmma_dq == WgmmaDq::kBulkTiles;
  // The preprocess also zeroes the dQ accumulator (one row per (token, head), as it walks them).
  const unsigned preprocess_blocks = unsigned((rows * (shape.head_dim / 8) + 255) / 256);
  if (shape.head_dim == 64)
    flash_backward_preprocess_kernel<64><<<preprocess_blocks, 256, 0, stream>>>(
        o, d_o, lse, delta, variant.wgmma ? lse_log2 : nullptr, dq_accum, dq_tiled, shape.o_stride(),
        int(shape.seq_q), int(shape.num_heads), rows);
  else
    flash_backward_preprocess_kernel<128><<<preprocess_blocks, 256, 0, stream>>>(
        o, d_o, lse, delta, variant.wgmma ? lse_log2 : nullptr, dq_accum, dq_tiled, shape.o_stride(),
        int(shape.seq_q), int(shape.num_heads), rows);
  MEGATUNE_CUDA_CHECK_LAUNCH();
  const hopper::BackwardArgs hopper_args{q,
                                         k,
                                         v,
                                         d_o,
                                         lse_log2,
                                         delta,
                                         dq_accum,
                                         dk,
                                         dv,
                                         shape.q_stride(),
                                         shape.k_stride(),
                                         shape.o_stride(),
                                         int(shape.batch),
                                         int(shape.seq_q),
                                         int(shape.num_heads),
                                         int(shape.num_kv_heads),
                                         int(shape.head_dim),
                                         shape.scale(),
                                         shape.scale() * kLog2e,
                                         shape.causal};
  if (warp_specialized)
    hopper::launch_backward_warp_specialized(hopper_args, variant.wgmma_ws_stages, dq_tiled, stream);
  else if (variant.wgmma)
    hopper::launch_backward(hopper_args, wgmma_warpgroups,
                            dq_tiled ? hopper::kDqBulkTiles : hopper::kDqAtomics, stream);
  else if (shape.head_dim == 64 && key_rows_per_block == 64)
    launch_backward_main<64, 64>(shape, params, stream);
  else if (shape.head_dim == 64)
    launch_backward_main<64, 128>(shape, params, stream);
  else if (key_rows_per_block == 64)
    launch_backward_main<128, 64>(shape, params, stream);
  else
    launch_backward_main<128, 128>(shape, params, stream);
  const int64_t vectors = (dq_tiled ? int64_t(dq_accum_elements(shape)) : rows * shape.head_dim) / 8;
  const unsigned convert_blocks = unsigned(std::min<int64_t>((vectors + 255) / 256, 132 * 16));
  if (dq_tiled)
    flash_backward_convert_dq_tiles_kernel<<<convert_blocks, 256, 0, stream>>>(
        dq_accum, dq, shape.q_stride(), int(shape.seq_q), int(shape.num_heads), int(shape.head_dim), vectors,
        shape.scale());
  else
    flash_backward_convert_dq_kernel<<<convert_blocks, 256, 0, stream>>>(
        dq_accum, dq, shape.q_stride(), shape.num_heads * shape.head_dim / 8, vectors, shape.scale());
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace megatune::executor::cuda
