// Flash attention backward (FlashAttention-2), templated on the q/k and v head dims, keys of another block
// (seq_kv) under a causal offset: delta = rowsum(dO o O) first; then a block owns 64 or 128 key rows of one
// (batch, kv head), one warp per 16 rows, and walks the query tiles of every head in its group:
// it recomputes P^T = exp(S^T - lse) from K Q^T, forms dS^T = P^T o (V dO^T - delta), accumulates
// dV += P^T dO and dK += dS^T Q in registers (GQA sums over the group for free), and adds dQ += dS K into an
// fp32 buffer with atomics (warps split dQ's query rows x head-dim columns); a last pass scales and converts
// dQ to bf16. 128 key rows per block halve the Q/dO tile loads and the dQ atomics per key row; warps whose
// key rows all lie above a causal query tile skip its matrix products. Blocks launch longest first under a
// causal mask (every head's key block 0 before any key block 1), which shortens the tail.
#include <algorithm>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/flash_attention.h"
#include "executor/cuda/flash_attention_common.cuh"
#include "executor/cuda/flash_attention_head_dims.cuh"
#include "executor/cuda/flash_attention_hopper.h"
#include "executor/cuda/kernel_utils.cuh"

namespace megatune::executor::cuda {
namespace {

using namespace flash;

struct BackwardParams {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  const bf16* d_o;
  const float* lse;    // [b, n_q, seq_q]
  const float* delta;  // [b, n_q, seq_q]
  float* dq_accum;     // [b, seq_q, n_q, DQK]
  bf16* dk;
  bf16* dv;
  KernelGeometry g;
  int64_t dk_stride, dv_stride;
  float scale, scale_log2;
  bool longest_first;  // grid (kv heads, batch, key blocks): key block 0 (the most causal work) first
};

// Query rows per step: 64, or 32 when the dK and dV accumulators (DQK + DV columns) leave fewer registers.
template <int DQK, int DV>
constexpr int backward_block_m() {
  return DQK + DV > 256 ? 32 : 64;
}

template <int DQK, int DV, int BLOCK_N>
constexpr int backward_smem_bytes() {
  constexpr int kBlockM = backward_block_m<DQK, DV>();
  return (BLOCK_N * (padded_width(DQK) + padded_width(DV)) +
          2 * kBlockM * (padded_width(DQK) + padded_width(DV)) + kBlockM * BLOCK_N) *
         int(sizeof(bf16));
}

// Lanes per (token, head) row of the preprocess: 16-byte chunks of a DV row, rounded up to 8, 16 or 32.
constexpr int preprocess_lanes(int dv) { return dv <= 64 ? 8 : (dv <= 128 ? 16 : 32); }

// delta[b, h, i] = sum_d dO[b, i, h, d] * O[b, i, h, d], and the row's DQK dQ accumulators zeroed (row layout
// [b, seq_q, n_q, DQK], or, when dq_tile_dim > 0, the tiled layout of hopper::dq_tile_offset with tiles
// dq_tile_dim >= DQK wide): preprocess_lanes(DV) lanes per row, 16-byte
// loads, sums reduced within the lane group. The block size is a multiple of 32.
template <int DQK, int DV>
__global__ void flash_backward_preprocess_kernel(const bf16* o, const bf16* d_o, const float* lse,
                                                 float* delta, float* lse_log2, float* dq_accum,
                                                 int dq_tile_dim, int64_t o_stride, int seq_len,
                                                 int num_heads, int64_t rows) {
  constexpr int kLanesPerRow = preprocess_lanes(DV);
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanesPerRow;
  const int part = threadIdx.x % kLanesPerRow;
  const bool valid = row < rows;  // no early exit: the whole warp takes part in the shuffles
  const int64_t token = valid ? row / num_heads : 0;
  const int head = valid ? int(row % num_heads) : 0;
  float sum = 0.0f;
  for (int chunk = part; valid && chunk < DV / 8; chunk += kLanesPerRow) {
    const int64_t at_o = token * o_stride + int64_t(head) * DV + 8 * chunk;
    float a[8], b[8];
    detail::unpack(*reinterpret_cast<const detail::Bf16x8*>(o + at_o), a);
    detail::unpack(*reinterpret_cast<const detail::Bf16x8*>(d_o + at_o), b);
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += a[i] * b[i];
  }
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (!valid) return;
  const int64_t batch = token / seq_len, position = token % seq_len;
  // Tiled: 8 columns are two 16-byte chunks of row position % 64 of a tile. Zeroing ignores the swizzle, so
  // the tile's rows are zeroed whole: a padded tile's real columns need not sit in a row's first chunks.
  const int zero_groups = dq_tile_dim > 0 ? dq_tile_dim / 8 : DQK / 8;
  for (int group = part; group < zero_groups; group += kLanesPerRow) {
    float* const zero_at = dq_tile_dim > 0
                               ? dq_accum +
                                     hopper::dq_tile_offset(batch, head, position / 64, (8 * group) / 64,
                                                            num_heads, seq_len, dq_tile_dim) +
                                     (position % 64) * 64 + (8 * group) % 64
                               : dq_accum + row * DQK + 8 * group;
    float4* zero = reinterpret_cast<float4*>(zero_at);
    zero[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    zero[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  if (part == 0) {
    const int64_t at = (batch * num_heads + head) * seq_len + position;
    delta[at] = sum;
    if (lse_log2 != nullptr) lse_log2[at] = lse[at] * kLog2e;  // the wgmma kernel's exponent offset
  }
}

// BLOCK_N key rows per block (64: 4 warps, 2 blocks per SM; 128: 8 warps, 1 block per SM). DQK (q, k) and
// DV (v, dO) are multiples of 16; shared-memory rows are padded to 64 columns.
template <int DQK, int DV, int BLOCK_N>
__global__ void __launch_bounds__(BLOCK_N * 2, BLOCK_N == 64 ? 2 : 1)
    flash_backward_kernel(const BackwardParams p) {
  constexpr int kBlockM = backward_block_m<DQK, DV>();
  constexpr int kBlockN = BLOCK_N;
  constexpr int kWarps = BLOCK_N / 16;
  constexpr int kThreads = kWarps * 32;
  constexpr int kQP = padded_width(DQK), kVP = padded_width(DV);
  constexpr int kQueryGroups = kBlockM / 16;            // dQ phase: warps per 16-row query slab ...
  constexpr int kColumnSplits = kWarps / kQueryGroups;  // ... times head-dim column splits
  static_assert((DQK / 16) % kColumnSplits == 0, "dQ's column pairs must split evenly over the warps");
  constexpr int kDpairsPerWarp = DQK / 16 / kColumnSplits;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* k_tile = reinterpret_cast<bf16*>(smem_raw);  // [kBlockN][kQP]
  bf16* v_tile = k_tile + kBlockN * kQP;             // [kBlockN][kVP]
  bf16* q_tiles = v_tile + kBlockN * kVP;            // [2][kBlockM][kQP]
  bf16* do_tiles = q_tiles + 2 * kBlockM * kQP;      // [2][kBlockM][kVP]
  bf16* ds_tile = do_tiles + 2 * kBlockM * kVP;      // [kBlockM (q)][kBlockN (kv)], swizzled rows

  const int n_block = p.longest_first ? blockIdx.z : blockIdx.x;
  const int group = p.longest_first ? blockIdx.x : blockIdx.y;
  const int batch = p.longest_first ? blockIdx.y : blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kv0 = n_block * kBlockN;
  const int64_t q_token0 = int64_t(batch) * p.g.seq_q, kv_token0 = int64_t(batch) * p.g.seq_kv;

  load_tile<kBlockN, DQK, kThreads, kQP>(k_tile, p.k + kv_token0 * p.g.k_stride + int64_t(group) * DQK,
                                         p.g.k_stride, kv0, p.g.seq_kv);
  load_tile<kBlockN, DV, kThreads, kVP>(v_tile, p.v + kv_token0 * p.g.v_stride + int64_t(group) * DV,
                                        p.g.v_stride, kv0, p.g.seq_kv);

  const int m_tiles = (p.g.seq_q + kBlockM - 1) / kBlockM;
  // Causal: query i sees key kv0 from i = kv0 - causal_offset on.
  const int m_first = p.g.causal ? max(0, kv0 - p.g.causal_offset) / kBlockM : 0;
  const int per_head = max(0, m_tiles - m_first);
  const int iterations = per_head * p.g.heads_per_group;

  auto issue_loads = [&](int it, int buffer) {
    const int head = group * p.g.heads_per_group + it / per_head;
    const int q0 = (m_first + it % per_head) * kBlockM;
    load_tile<kBlockM, DQK, kThreads, kQP>(q_tiles + buffer * kBlockM * kQP,
                                           p.q + q_token0 * p.g.q_stride + int64_t(head) * DQK, p.g.q_stride,
                                           q0, p.g.seq_q);
    load_tile<kBlockM, DV, kThreads, kVP>(do_tiles + buffer * kBlockM * kVP,
                                          p.d_o + q_token0 * p.g.o_stride + int64_t(head) * DV, p.g.o_stride,
                                          q0, p.g.seq_q);
  };
  if (iterations > 0) issue_loads(0, 0);
  cp_async_commit();

  float dv_acc[DV / 8][4], dk_acc[DQK / 8][4];
#pragma unroll
  for (int i = 0; i < DV / 8; ++i) dv_acc[i][0] = dv_acc[i][1] = dv_acc[i][2] = dv_acc[i][3] = 0.0f;
#pragma unroll
  for (int i = 0; i < DQK / 8; ++i) dk_acc[i][0] = dk_acc[i][1] = dk_acc[i][2] = dk_acc[i][3] = 0.0f;
  const int my_kv[2] = {kv0 + warp * 16 + (lane >> 2), kv0 + warp * 16 + (lane >> 2) + 8};

  for (int it = 0; it < iterations; ++it) {
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < iterations) issue_loads(it + 1, (it + 1) & 1);
    cp_async_commit();
    const int head = group * p.g.heads_per_group + it / per_head;
    const int q0 = (m_first + it % per_head) * kBlockM;
    const bf16* q_tile = q_tiles + (it & 1) * kBlockM * kQP;
    const bf16* do_tile = do_tiles + (it & 1) * kBlockM * kVP;
    const int64_t stats0 = (int64_t(batch) * p.g.num_heads + head) * p.g.seq_q;

    // A warp whose 16 key rows all lie after what the tile's last query sees: P = dS = 0.
    const bool warp_masked = p.g.causal && kv0 + warp * 16 > q0 + kBlockM - 1 + p.g.causal_offset;

    // S^T = K_w Q^T and dP^T = V_w dO^T (16 key rows x kBlockM query columns per warp).
    float s[kBlockM / 8][4], dp[kBlockM / 8][4];
#pragma unroll
    for (int n = 0; n < kBlockM / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
    }
    if (!warp_masked) {
      strip_times_tile_t<DQK, kQP, kBlockM>(s, k_tile, warp * 16, q_tile);
      strip_times_tile_t<DV, kVP, kBlockM>(dp, v_tile, warp * 16, do_tile);
    }
    // P^T and dS^T in place (s <- P^T, dp <- dS^T).
#pragma unroll
    for (int n = 0; n < kBlockM / 8; ++n) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int q = q0 + n * 8 + 2 * (lane & 3) + c;
        const bool q_valid = q < p.g.seq_q;
        const float lse_log2 = q_valid ? __ldg(p.lse + stats0 + q) * kLog2e : 0.0f;
        const float delta = q_valid ? __ldg(p.delta + stats0 + q) : 0.0f;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int e = 2 * r + c;
          const bool visible = q_valid && !(p.g.causal && q + p.g.causal_offset < my_kv[r]);
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
      accumulators_as_a(a_p, s[2 * kk], s[2 * kk + 1]);
      accumulators_as_a(a_ds, dp[2 * kk], dp[2 * kk + 1]);
      fragment_times_rows<DV, kVP>(dv_acc, a_p, do_tile, kk * 16);
      fragment_times_rows<DQK, kQP>(dk_acc, a_ds, q_tile, kk * 16);
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
        load_b_kn<kQP>(b, k_tile, kk * 16, dpair * 16);
        mma(acc[0], a_ds[kk], b[0], b[1]);
        mma(acc[1], a_ds[kk], b[2], b[3]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (q_row[r] >= p.g.seq_q) continue;
          float* dst = p.dq_accum + ((q_token0 + q_row[r]) * p.g.num_heads + head) * DQK + dpair * 16 +
                       h * 8 + 2 * (lane & 3);
          atomicAdd(reinterpret_cast<float2*>(dst), make_float2(acc[h][2 * r], acc[h][2 * r + 1]));
        }
      }
    }
  }
  cp_async_wait<0>();  // no copy may still target shared memory when the block exits

  // Store dK (scaled) and dV for this block's key rows (zero where no query sees them).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int kv = my_kv[r];
    if (kv >= p.g.seq_kv) continue;
    bf16* dk_row = p.dk + (kv_token0 + kv) * p.dk_stride + int64_t(group) * DQK;
    bf16* dv_row = p.dv + (kv_token0 + kv) * p.dv_stride + int64_t(group) * DV;
#pragma unroll
    for (int i = 0; i < DQK / 8; ++i) {
      const int col = i * 8 + 2 * (lane & 3);
      *reinterpret_cast<__nv_bfloat162*>(dk_row + col) =
          __floats2bfloat162_rn(dk_acc[i][2 * r] * p.scale, dk_acc[i][2 * r + 1] * p.scale);
    }
#pragma unroll
    for (int i = 0; i < DV / 8; ++i) {
      const int col = i * 8 + 2 * (lane & 3);
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

// The same from the tiled accumulator (hopper::dq_tile_offset, tiles tile_dim wide): vectors walk the tiles
// in memory order, 8 per 64-float row, so a warp reads 4 whole rows and writes 4 rows' 128 contiguous bytes;
// rows past the sequence's end (the last tile's padding) and columns past head_dim are skipped.
__global__ void flash_backward_convert_dq_tiles_kernel(const float* dq_accum, bf16* dq, int64_t q_stride,
                                                       int seq_len, int num_heads, int head_dim, int tile_dim,
                                                       int64_t vectors, float scale) {
  const int64_t row_blocks = hopper::dq_row_blocks(seq_len), col_blocks = tile_dim / 64;
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < vectors;
       v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t tile = v >> 9;
    const int r = int(v >> 3) & 63, m = int(v) & 7;
    const int64_t col_block = tile % col_blocks, rest = tile / col_blocks;
    const int64_t position = (rest % row_blocks) * 64 + r, head_batch = rest / row_blocks;
    if (position >= seq_len || col_block * 64 + 8 * m >= head_dim) continue;
    const int64_t head = head_batch % num_heads, batch = head_batch / num_heads;
    const float4* row = reinterpret_cast<const float4*>(dq_accum + tile * 4096 + r * 64);
    *reinterpret_cast<uint4*>(dq + (batch * seq_len + position) * q_stride + head * head_dim +
                              col_block * 64 + 8 * m) =
        scaled_bf16x8(row[(2 * m) ^ (r & 7)], row[(2 * m + 1) ^ (r & 7)], scale);
  }
}

size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// fp32 elements of the dQ accumulator: the sequence rounded up to the tiled layout's 64 rows and the head dim
// to its 64 columns (the tiles of head dims 80 and 96 are 128 wide; the row layout uses the first
// b * s * n_q * d of them).
size_t dq_accum_elements(const AttentionShape& shape) {
  return size_t(shape.batch) * size_t(shape.num_heads) * size_t(hopper::dq_row_blocks(shape.seq_q)) * 64 *
         size_t((shape.head_dim + 63) / 64 * 64);
}

// The main pass for one (head dims, key rows per block); sets the shared-memory limit on first use.
template <int DQK, int DV, int BLOCK_N>
void launch_backward_main(const AttentionShape& shape, const BackwardParams& params, cudaStream_t stream) {
  constexpr int smem = backward_smem_bytes<DQK, DV, BLOCK_N>();
  static bool configured = false;
  if (!configured) {
    MEGATUNE_CUDA_CHECK(cudaFuncSetAttribute(flash_backward_kernel<DQK, DV, BLOCK_N>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = true;
  }
  const unsigned key_blocks = unsigned((shape.kv_len() + BLOCK_N - 1) / BLOCK_N);
  const dim3 grid = params.longest_first
                        ? dim3(unsigned(shape.num_kv_heads), unsigned(shape.batch), key_blocks)
                        : dim3(key_blocks, unsigned(shape.num_kv_heads), unsigned(shape.batch));
  flash_backward_kernel<DQK, DV, BLOCK_N><<<grid, BLOCK_N * 2, smem, stream>>>(params);
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
  BackwardVariant variant;
  if (!flash::hopper_takes(shape)) variant.wgmma = false;  // the mma.sync kernel, 64 key rows per block
  if (shape.head_dim == 256) variant.wgmma_dq = WgmmaDq::kAtomics;  // the wide kernel's dQ
  flash_attention_backward_variant(shape, q, k, v, o, lse, d_o, dq, dk, dv, workspace, workspace_bytes,
                                   stream, variant);
}

namespace {

void check_backward_arguments(const AttentionShape& shape, const BackwardVariant& variant,
                              std::initializer_list<const void*> tensors, size_t workspace_bytes) {
  validate_attention_shape(shape);
  if (variant.key_rows_per_block != 64 && variant.key_rows_per_block != 128)
    throw std::invalid_argument("flash_attention_backward_variant: key_rows_per_block must be 64 or 128");
  if (variant.wgmma_ws_stages != 2 && variant.wgmma_ws_stages != 3)
    throw std::invalid_argument("flash_attention_backward_variant: wgmma_ws_stages must be 2 or 3");
  if (variant.wgmma_warpgroups < 0 || variant.wgmma_warpgroups > 2)
    throw std::invalid_argument("flash_attention_backward_variant: wgmma_warpgroups must be 0, 1 or 2");
  if (!flash_attention_supports(shape))
    throw std::invalid_argument("flash_attention_backward: " + flash_attention_unsupported(shape));
  if (variant.wgmma && !flash::hopper_takes(shape))
    throw std::invalid_argument(
        "flash_attention_backward_variant: the wgmma kernels take head dim 64, 80, 96, 128 or 256 "
        "self-attention with the forward's strides only");
  if (variant.wgmma && flash::hopper_pads(shape) &&
      !(variant.wgmma_warp_specialized && variant.wgmma_dq == WgmmaDq::kBulkTiles &&
        variant.wgmma_ws_stages == 2))
    throw std::invalid_argument(
        "flash_attention_backward_variant: head dims 80 and 96 take the warp-specialized wgmma kernel with "
        "bulk dQ tiles and 2 stages only");
  if (variant.wgmma && shape.head_dim == 256 &&
      !(variant.wgmma_warp_specialized && variant.wgmma_dq == WgmmaDq::kAtomics &&
        variant.wgmma_ws_stages == 2))
    throw std::invalid_argument(
        "flash_attention_backward_variant: head dim 256 takes the warp-specialized wgmma kernel with dQ "
        "atomics and 2 stages only");
  if (!variant.wgmma && variant.key_rows_per_block == 128 &&
      !(shape.head_dim == shape.v_dim() && (shape.head_dim == 64 || shape.head_dim == 128)))
    throw std::invalid_argument(
        "flash_attention_backward_variant: 128 key rows per block take head dim 64 or "
        "128 only");
  for (const void* ptr : tensors) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      throw std::invalid_argument("flash_attention_backward: tensors must be 16-byte aligned");
  }
  if (workspace_bytes < flash_attention_backward_workspace_bytes(shape))
    throw std::invalid_argument("flash_attention_backward: workspace smaller than the queried size");
}

// The mma.sync main pass for the shape's head dims.
void launch_mma_backward(const AttentionShape& shape, const BackwardParams& params, int key_rows_per_block,
                         cudaStream_t stream) {
  if (key_rows_per_block == 128 && shape.head_dim == 64 && shape.v_dim() == 64)
    launch_backward_main<64, 64, 128>(shape, params, stream);
  else if (key_rows_per_block == 128)
    launch_backward_main<128, 128, 128>(shape, params, stream);
  else
    flash::with_head_dims(shape.head_dim, shape.v_dim(), [&](auto dims) {
      using Dims = decltype(dims);
      launch_backward_main<Dims::qk, Dims::v, 64>(shape, params, stream);
    });
}

}  // namespace

void flash_attention_backward_variant(const AttentionShape& shape, const bf16* q, const bf16* k,
                                      const bf16* v, const bf16* o, const float* lse, const bf16* d_o,
                                      bf16* dq, bf16* dk, bf16* dv, void* workspace, size_t workspace_bytes,
                                      cudaStream_t stream, BackwardVariant variant) {
  check_backward_arguments(shape, variant, {q, k, v, o, d_o, dq, dk, dv}, workspace_bytes);
  const int64_t tokens = shape.batch * shape.seq_q;
  const size_t dq_bytes = dq_accum_elements(shape) * sizeof(float);
  auto* dq_accum = static_cast<float*>(workspace);
  auto* delta = reinterpret_cast<float*>(static_cast<char*>(workspace) + align256(dq_bytes));
  auto* lse_log2 = reinterpret_cast<float*>(
      reinterpret_cast<char*>(delta) + align256(size_t(tokens) * size_t(shape.num_heads) * sizeof(float)));

  const int64_t rows = tokens * shape.num_heads;
  const int wgmma_warpgroups = variant.wgmma_warpgroups != 0 ? variant.wgmma_warpgroups : 2;
  const bool warp_specialized =
      variant.wgmma && variant.wgmma_warp_specialized && hopper::warp_specialized_takes(tokens);
  const bool dq_tiled =
      variant.wgmma && (warp_specialized || wgmma_warpgroups == 2) && variant.wgmma_dq == WgmmaDq::kBulkTiles;
  const int tile_dim = hopper::tile_head_dim(int(shape.head_dim));
  // The preprocess also zeroes the dQ accumulator (one row per (token, head), as it walks them).
  flash::with_head_dims(shape.head_dim, shape.v_dim(), [&](auto dims) {
    using Dims = decltype(dims);
    const unsigned blocks = unsigned((rows * preprocess_lanes(Dims::v) + 255) / 256);
    flash_backward_preprocess_kernel<Dims::qk, Dims::v><<<blocks, 256, 0, stream>>>(
        o, d_o, lse, delta, variant.wgmma ? lse_log2 : nullptr, dq_accum, dq_tiled ? tile_dim : 0,
        shape.o_stride(), int(shape.seq_q), int(shape.num_heads), rows);
  });
  MEGATUNE_CUDA_CHECK_LAUNCH();
  if (variant.wgmma) {
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
    if (warp_specialized && shape.head_dim == 256)
      hopper::launch_backward_wide(hopper_args, stream);
    else if (warp_specialized)
      hopper::launch_backward_warp_specialized(hopper_args, variant.wgmma_ws_stages, dq_tiled, stream);
    else
      hopper::launch_backward(hopper_args, wgmma_warpgroups,
                              dq_tiled ? hopper::kDqBulkTiles : hopper::kDqAtomics, stream);
  } else {
    const BackwardParams params{q,
                                k,
                                v,
                                d_o,
                                lse,
                                delta,
                                dq_accum,
                                dk,
                                dv,
                                geometry_of(shape),
                                shape.dk_stride(),
                                shape.dv_stride(),
                                shape.scale(),
                                shape.scale() * kLog2e,
                                variant.longest_first};
    launch_mma_backward(shape, params, variant.key_rows_per_block, stream);
  }
  const int64_t vectors = (dq_tiled ? int64_t(dq_accum_elements(shape)) : rows * shape.head_dim) / 8;
  const unsigned convert_blocks = unsigned(std::min<int64_t>((vectors + 255) / 256, 132 * 16));
  if (dq_tiled)
    flash_backward_convert_dq_tiles_kernel<<<convert_blocks, 256, 0, stream>>>(
        dq_accum, dq, shape.dq_stride(), int(shape.seq_q), int(shape.num_heads), int(shape.head_dim),
        tile_dim, vectors, shape.scale());
  else
    flash_backward_convert_dq_kernel<<<convert_blocks, 256, 0, stream>>>(
        dq_accum, dq, shape.dq_stride(), shape.num_heads * shape.head_dim / 8, vectors, shape.scale());
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace megatune::executor::cuda
