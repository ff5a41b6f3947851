// Flash attention forward (FlashAttention-2): a block owns 128 query rows of one (batch, head), split over
// warps of 16 or 32 rows; it streams 64-row K/V tiles through double-buffered shared memory (cp.async),
// computes S = Q K^T and O += P V with mma.sync, and keeps the softmax online in fp32 registers (base-2
// exponent). Templated on the q/k and v head dims; keys of another block (seq_kv) under a causal offset.
// The entry points dispatch head dim 64 / 80 / 96 / 128 / 256 and 192 / 128 self-attention to the Hopper
// wgmma kernels.
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/flash_attention.h"
#include "executor/cuda/flash_attention_common.cuh"
#include "executor/cuda/flash_attention_head_dims.cuh"
#include "executor/cuda/flash_attention_hopper.h"

namespace megatune::executor::cuda {
namespace {

using namespace flash;

constexpr int kBlockM = 128;
constexpr int kBlockN = 64;

struct ForwardParams {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  bf16* o;
  float* lse;
  KernelGeometry g;
  float scale_log2;  // softmax scale * log2(e)
};

template <int DQK, int DV>
constexpr int forward_smem_bytes() {
  return (kBlockM * padded_width(DQK) + 2 * kBlockN * (padded_width(DQK) + padded_width(DV))) *
         int(sizeof(bf16));
}

// M_TILES = 16-row tiles per warp: 1 (8 warps) or 2 (4 warps; each K/V fragment then feeds twice the MMAs).
// Q fragments stay in registers with one tile per warp and DQK <= 128, else they are re-read from shared
// memory. DQK (q, k) and DV (v, o) are multiples of 16; shared-memory rows are padded to 64 columns.
template <int DQK, int DV, int M_TILES>
__global__ void __launch_bounds__(32 * kBlockM / (16 * M_TILES), M_TILES == 1 ? 1 : 2)
    flash_forward_kernel(const ForwardParams p) {
  constexpr int kThreads = 32 * kBlockM / (16 * M_TILES);
  constexpr int kRowsPerWarp = 16 * M_TILES;
  constexpr int kQP = padded_width(DQK), kVP = padded_width(DV);
  constexpr bool kQInRegisters = M_TILES == 1 && DQK <= 128;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* q_tile = reinterpret_cast<bf16*>(smem_raw);
  bf16* k_tiles = q_tile + kBlockM * kQP;       // [2][kBlockN][kQP]
  bf16* v_tiles = k_tiles + 2 * kBlockN * kQP;  // [2][kBlockN][kVP]

  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest (causal) blocks first
  const int head = blockIdx.y, batch = blockIdx.z;
  const int group = head / p.g.heads_per_group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int q0 = m_block * kBlockM;

  const bf16* q_base = p.q + int64_t(batch) * p.g.seq_q * p.g.q_stride + int64_t(head) * DQK;
  const bf16* k_base = p.k + int64_t(batch) * p.g.seq_kv * p.g.k_stride + int64_t(group) * DQK;
  const bf16* v_base = p.v + int64_t(batch) * p.g.seq_kv * p.g.v_stride + int64_t(group) * DV;

  int n_blocks = (p.g.seq_kv + kBlockN - 1) / kBlockN;
  if (p.g.causal)
    n_blocks = max(0, min(n_blocks, (q0 + kBlockM + p.g.causal_offset + kBlockN - 1) / kBlockN));

  load_tile<kBlockM, DQK, kThreads, kQP>(q_tile, q_base, p.g.q_stride, q0, p.g.seq_q);
  if (n_blocks > 0) {
    load_tile<kBlockN, DQK, kThreads, kQP>(k_tiles, k_base, p.g.k_stride, 0, p.g.seq_kv);
    load_tile<kBlockN, DV, kThreads, kVP>(v_tiles, v_base, p.g.v_stride, 0, p.g.seq_kv);
  }
  cp_async_commit();

  float o_acc[M_TILES][DV / 8][4];
  float row_max[M_TILES][2], row_sum[M_TILES][2];
  const int warp_row0 = q0 + warp * kRowsPerWarp;  // first query row of this warp
#pragma unroll
  for (int m = 0; m < M_TILES; ++m) {
#pragma unroll
    for (int i = 0; i < DV / 8; ++i) o_acc[m][i][0] = o_acc[m][i][1] = o_acc[m][i][2] = o_acc[m][i][3] = 0.0f;
    row_max[m][0] = row_max[m][1] = -INFINITY;
    row_sum[m][0] = row_sum[m][1] = 0.0f;
  }
  uint32_t q_frag[kQInRegisters ? DQK / 16 : 1][4];

  for (int j = 0; j < n_blocks; ++j) {
    cp_async_wait<0>();
    __syncthreads();
    if (j + 1 < n_blocks) {
      const int buffer = (j + 1) & 1;
      load_tile<kBlockN, DQK, kThreads, kQP>(k_tiles + buffer * kBlockN * kQP, k_base, p.g.k_stride,
                                             (j + 1) * kBlockN, p.g.seq_kv);
      load_tile<kBlockN, DV, kThreads, kVP>(v_tiles + buffer * kBlockN * kVP, v_base, p.g.v_stride,
                                            (j + 1) * kBlockN, p.g.seq_kv);
      cp_async_commit();
    }
    if constexpr (kQInRegisters) {
      if (j == 0) {
#pragma unroll
        for (int kk = 0; kk < DQK / 16; ++kk) load_a<kQP>(q_frag[kk], q_tile, warp * 16, kk * 16);
      }
    }
    const int kv0 = j * kBlockN;
    // Causal: this warp's rows see none of this tile -> nothing to do (still joins the barriers).
    if (p.g.causal && kv0 > warp_row0 + kRowsPerWarp - 1 + p.g.causal_offset) continue;
    const bf16* k_tile = k_tiles + (j & 1) * kBlockN * kQP;
    const bf16* v_tile = v_tiles + (j & 1) * kBlockN * kVP;

    float s[M_TILES][kBlockN / 8][4];
#pragma unroll
    for (int m = 0; m < M_TILES; ++m) {
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < DQK / 16; ++kk) {
      uint32_t a[M_TILES][4];
#pragma unroll
      for (int m = 0; m < M_TILES; ++m) {
        if constexpr (kQInRegisters) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[m][e] = q_frag[kk][e];
        } else {
          load_a<kQP>(a[m], q_tile, warp * kRowsPerWarp + m * 16, kk * 16);
        }
      }
#pragma unroll
      for (int np = 0; np < kBlockN / 16; ++np) {
        uint32_t b[4];
        load_b_nk<kQP>(b, k_tile, np * 16, kk * 16);
#pragma unroll
        for (int m = 0; m < M_TILES; ++m) {
          mma(s[m][2 * np], a[m], b[0], b[1]);
          mma(s[m][2 * np + 1], a[m], b[2], b[3]);
        }
      }
    }
    // Mask (end of the keys; causal diagonal): only tiles that cross the diagonal or the end need it.
    if (kv0 + kBlockN > p.g.seq_kv || (p.g.causal && kv0 + kBlockN - 1 > warp_row0 + p.g.causal_offset)) {
#pragma unroll
      for (int m = 0; m < M_TILES; ++m) {
#pragma unroll
        for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = kv0 + n * 8 + 2 * (lane & 3) + (e & 1);
            const int row = warp_row0 + m * 16 + (lane >> 2) + 8 * (e >> 1);
            if (col >= p.g.seq_kv || (p.g.causal && col > row + p.g.causal_offset)) s[m][n][e] = -INFINITY;
          }
        }
      }
    }
    // Online softmax for the thread's rows (a quad of 4 lanes shares a row). The maximum is taken on raw
    // scores (scale > 0) and the scale folded into one FFMA per element: p = 2^(s * scale_log2 - max).
#pragma unroll
    for (int m = 0; m < M_TILES; ++m) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int n = 0; n < kBlockN / 8; ++n)
          tile_max = fmaxf(tile_max, fmaxf(s[m][n][2 * r], s[m][n][2 * r + 1]));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[m][r], tile_max * p.scale_log2);
        const float safe_max = new_max == -INFINITY ? 0.0f : new_max;
        const float correction = fast_exp2(row_max[m][r] - safe_max);
        row_max[m][r] = new_max;
        row_sum[m][r] *= correction;
        // Later tiles rarely raise the maximum: skip the rescale when no row of the warp needs it.
        if (__any_sync(0xffffffffu, correction != 1.0f)) {
#pragma unroll
          for (int i = 0; i < DV / 8; ++i) {
            o_acc[m][i][2 * r] *= correction;
            o_acc[m][i][2 * r + 1] *= correction;
          }
        }
#pragma unroll
        for (int n = 0; n < kBlockN / 8; ++n) {
          s[m][n][2 * r] = fast_exp2(fmaf(s[m][n][2 * r], p.scale_log2, -safe_max));
          s[m][n][2 * r + 1] = fast_exp2(fmaf(s[m][n][2 * r + 1], p.scale_log2, -safe_max));
          row_sum[m][r] += s[m][n][2 * r] + s[m][n][2 * r + 1];
        }
      }
    }
    // O += P V: P's accumulators become A fragments (16 rows x 16 kv per k-step).
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[M_TILES][4];
#pragma unroll
      for (int m = 0; m < M_TILES; ++m) {
        a[m][0] = pack_bf16(s[m][2 * kk][0], s[m][2 * kk][1]);
        a[m][1] = pack_bf16(s[m][2 * kk][2], s[m][2 * kk][3]);
        a[m][2] = pack_bf16(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
        a[m][3] = pack_bf16(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < DV / 16; ++dp) {
        uint32_t b[4];
        load_b_kn<kVP>(b, v_tile, kk * 16, dp * 16);
#pragma unroll
        for (int m = 0; m < M_TILES; ++m) {
          mma(o_acc[m][2 * dp], a[m], b[0], b[1]);
          mma(o_acc[m][2 * dp + 1], a[m], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // no copy may still target shared memory when the block exits

  // Finish: full row sums across the quad, normalize, store O and the log-sum-exp (-inf and O = 0 for a
  // query that attends no key).
#pragma unroll
  for (int m = 0; m < M_TILES; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[m][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int row = warp_row0 + m * 16 + (lane >> 2) + 8 * r;
      if (row < p.g.seq_q) {
        bf16* o_row = p.o + (int64_t(batch) * p.g.seq_q + row) * p.g.o_stride + int64_t(head) * DV;
#pragma unroll
        for (int i = 0; i < DV / 8; ++i) {
          const int col = i * 8 + 2 * (lane & 3);
          *reinterpret_cast<__nv_bfloat162*>(o_row + col) =
              __floats2bfloat162_rn(o_acc[m][i][2 * r] * inverse, o_acc[m][i][2 * r + 1] * inverse);
        }
        if ((lane & 3) == 0) {
          p.lse[(int64_t(batch) * p.g.num_heads + head) * p.g.seq_q + row] =
              sum > 0.0f ? row_max[m][r] * kLn2 + logf(sum) : -INFINITY;
        }
      }
    }
  }
}

template <int DQK, int DV, int M_TILES>
void launch_forward(const ForwardParams& params, const AttentionShape& shape, cudaStream_t stream) {
  constexpr int smem = forward_smem_bytes<DQK, DV>();
  constexpr int threads = 32 * kBlockM / (16 * M_TILES);
  static bool configured = false;
  if (!configured) {
    MEGATUNE_CUDA_CHECK(cudaFuncSetAttribute(flash_forward_kernel<DQK, DV, M_TILES>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = true;
  }
  const dim3 grid(unsigned((shape.seq_q + kBlockM - 1) / kBlockM), unsigned(shape.num_heads),
                  unsigned(shape.batch));
  flash_forward_kernel<DQK, DV, M_TILES><<<grid, threads, smem, stream>>>(params);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The wgmma kernels (hopper_forward_takes(shape)): one or two warpgroups per block, or warp-specialized.
void launch_hopper_forward(const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v, bf16* o,
                           float* lse, cudaStream_t stream, int wgmma_warpgroups, bool warp_specialized,
                           bool ping_pong) {
  const hopper::ForwardArgs args{q,
                                 k,
                                 v,
                                 o,
                                 lse,
                                 shape.q_stride(),
                                 shape.k_stride(),
                                 shape.o_stride(),
                                 int(shape.batch),
                                 int(shape.seq_q),
                                 int(shape.num_heads),
                                 int(shape.num_heads / shape.num_kv_heads),
                                 int(shape.head_dim),
                                 int(shape.v_dim()),
                                 shape.scale() * kLog2e,
                                 shape.causal};
  if (warp_specialized) {
    if (wgmma_warpgroups == 1 || (wgmma_warpgroups == 3 && shape.head_dim != 64))
      throw std::invalid_argument(
          "flash_attention_forward_variant: the warp-specialized kernel takes 2 consumer warpgroups, or 3 "
          "for head dim 64");
    hopper::launch_forward_warp_specialized(
        args, wgmma_warpgroups != 0 ? wgmma_warpgroups : (shape.head_dim == 64 ? 3 : 2), ping_pong, stream);
  } else {
    // One warpgroup per block (three blocks per SM) for head dim 64, two (one block, shared K/V tiles) for
    // 128: H200, bench_attention_gpu: 365 vs 313 TFLOP/s at 64, 258 vs 337 at 128 (bench/RESULTS.md).
    hopper::launch_forward(args, wgmma_warpgroups != 0 ? wgmma_warpgroups : (shape.head_dim == 64 ? 1 : 2),
                           stream);
  }
}

}  // namespace

std::string flash_attention_unsupported(const AttentionShape& shape) {
  if (!head_dims_compiled(shape.head_dim, shape.v_dim()))
    return "head dim " + std::to_string(shape.head_dim) +
           (shape.v_dim() != shape.head_dim ? " with v head dim " + std::to_string(shape.v_dim())
                                            : std::string()) +
           ": the CUDA attention kernels take " + kHeadDimsInWords;
  for (const int64_t stride : {shape.q_stride(), shape.k_stride(), shape.v_stride(), shape.o_stride(),
                               shape.dq_stride(), shape.dk_stride(), shape.dv_stride()})
    if (stride % 8 != 0)
      return "the CUDA attention kernels need token strides that are multiples of 8 elements";
  if (shape.seq_q >= (int64_t(1) << 30) || shape.kv_len() >= (int64_t(1) << 30) ||
      std::abs(shape.causal_offset) >= (int64_t(1) << 30))
    return "the CUDA attention kernels take sequences and causal offsets below 2^30 tokens";
  return {};
}

bool flash_attention_supports(const AttentionShape& shape) {
  return shape.num_heads % shape.num_kv_heads == 0 && flash_attention_unsupported(shape).empty();
}

void flash_attention_forward(const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v,
                             bf16* o, float* lse, cudaStream_t stream) {
  if (hopper_forward_takes(shape)) {
    const bool warp_specialized = hopper::warp_specialized_takes(shape.batch * shape.seq_q);
    flash_attention_forward_variant(shape, q, k, v, o, lse, stream, kDefaultForwardRowsPerWarp, 0,
                                    warp_specialized);
  } else {
    flash_attention_forward_variant(shape, q, k, v, o, lse, stream, shape.head_dim > 128 ? 16 : 32);
  }
}

void flash_attention_forward_variant(const AttentionShape& shape, const bf16* q, const bf16* k, const bf16* v,
                                     bf16* o, float* lse, cudaStream_t stream, int rows_per_warp,
                                     int wgmma_warpgroups, bool wgmma_warp_specialized,
                                     bool wgmma_ping_pong) {
  validate_attention_shape(shape);
  if (!flash_attention_supports(shape))
    throw std::invalid_argument("flash_attention_forward: " + flash_attention_unsupported(shape));
  if (!aligned(q) || !aligned(k) || !aligned(v) || !aligned(o))
    throw std::invalid_argument("flash_attention_forward: q, k, v, o must be 16-byte aligned");
  if (rows_per_warp != 16 && rows_per_warp != 32 && rows_per_warp != 64)
    throw std::invalid_argument("flash_attention_forward_variant: rows_per_warp must be 16, 32 or 64");
  if (rows_per_warp == 64 && !hopper_forward_takes(shape))
    throw std::invalid_argument(
        "flash_attention_forward_variant: the wgmma kernels (rows_per_warp 64) take "
        "head dim 64, 80, 96, 128, 256 or 192 / 128 self-attention only");
  if (rows_per_warp == 64 && hopper_warp_specialized_only(shape) && !wgmma_warp_specialized)
    throw std::invalid_argument(
        "flash_attention_forward_variant: head dims 80, 96, 192 / 128 and 256 take the warp-specialized "
        "wgmma "
        "kernel only");
  if (wgmma_warpgroups < 0 || wgmma_warpgroups > (wgmma_warp_specialized ? 3 : 2))
    throw std::invalid_argument(
        "flash_attention_forward_variant: wgmma_warpgroups must be 0, 1 or 2 (0, 2 or 3 warp-specialized)");
  if (rows_per_warp == 64) {
    launch_hopper_forward(shape, q, k, v, o, lse, stream, wgmma_warpgroups, wgmma_warp_specialized,
                          wgmma_ping_pong);
    return;
  }
  const ForwardParams params{q, k, v, o, lse, geometry_of(shape), shape.scale() * kLog2e};
  with_head_dims(shape.head_dim, shape.v_dim(), [&](auto dims) {
    using Dims = decltype(dims);
    if (rows_per_warp == 16) {
      launch_forward<Dims::qk, Dims::v, 1>(params, shape, stream);
    } else {
      launch_forward<Dims::qk, Dims::v, 2>(params, shape, stream);
    }
  });
}

}  // namespace megatune::executor::cuda
