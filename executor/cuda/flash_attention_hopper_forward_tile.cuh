// One key tile of the Hopper attention forward for one warpgroup's 64 query rows, and the final O / lse
// stores, shared by flash_attention_hopper_forward.cu (cp.async loads) and
// flash_attention_hopper_forward_ws.cu (warp-specialized, TMA loads). Accumulator layouts: wgmma.cuh.
#pragma once
#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>

#include "executor/cuda/flash_attention_common.cuh"
#include "executor/cuda/flash_attention_hopper.h"
#include "executor/cuda/wgmma.cuh"

namespace megatune::executor::cuda::hopper {

// S = Q K^T (64 x kBlockN: this warpgroup's rows at q_address of a q_rows-row Q tile, the K tile at
// k_address), masked where the tile crosses the causal diagonal or the sequence's end, then the online
// softmax per row (each row's kBlockN columns live on the 4 lanes of one quad): the row maxima and the O
// rescale first, then per 16 key columns P = exp2(S - m) and that chunk's O += P V issued at once, so the
// tensor cores work on chunk kk while the next chunk's exponentials run. Returns with the products done.
// before_scores() runs before S's product is issued and after_scores() once it is done (the
// warp-specialized kernel's ping-pong between consumer warpgroups); both do nothing by default. DK: the
// head-dim columns the score product reads (the real head dim of a tile zero-padded to D; a multiple of 16).
struct NoHook {
  __device__ void operator()() const {}
};
template <int D, int kBlockN, int DK = D, typename BeforeScores = NoHook, typename AfterScores = NoHook>
__device__ __forceinline__ void forward_tile(const ForwardArgs& p, uint32_t q_address, int q_rows,
                                             uint32_t k_address, uint64_t v_desc, int kv0, int wg_row0,
                                             const int (&q_row)[2], int t, float (&o)[D / 2],
                                             float (&row_max)[2], float (&row_sum)[2],
                                             BeforeScores before_scores = {}, AfterScores after_scores = {}) {
  using flash::fast_exp2;
  float s[kBlockN / 2];
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) s[i] = 0.0f;
  before_scores();
  wgmma_fence();
  gemm_k_major<DK, kBlockN>(s, q_address, q_rows, k_address);
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(s);
  after_scores();

  const bool needs_mask = (p.causal && kv0 + kBlockN - 1 > wg_row0) || kv0 + kBlockN > p.seq_len;
  if (needs_mask) {
#pragma unroll
    for (int i = 0; i < kBlockN / 8; ++i) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int kv = kv0 + 8 * i + 2 * t + c;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (kv >= p.seq_len || (p.causal && kv > q_row[r])) s[4 * i + 2 * r + c] = -INFINITY;
        }
      }
    }
  }
  float m_new[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kBlockN / 8; ++i) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    m_new[r] = fmaxf(row_max[r], mx * p.scale_log2);
    const float alpha = fast_exp2(row_max[r] - m_new[r]);
    row_max[r] = m_new[r];
    row_sum[r] *= alpha;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      o[4 * i + 2 * r] *= alpha;
      o[4 * i + 2 * r + 1] *= alpha;
    }
  }
  uint32_t pa[kBlockN / 16][4];
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int r = (e >> 1) & 1;
      const float prob = fast_exp2(fmaf(s[8 * kk + e], p.scale_log2, -m_new[r]));
      s[8 * kk + e] = prob;
      row_sum[r] += prob;
    }
    pack_a_fragment(pa[kk], s, 8 * kk);
    wgmma_fence();
    const uint64_t b = advance(v_desc, kk * 16 * 128);
    if constexpr (D == 256) {  // two n128 products: columns 0-127 (V panels 0, 1) and 128-255 (panels 2, 3)
      wgmma_rs_m64n128<1>(*reinterpret_cast<float(*)[64]>(o), pa[kk], b, 1);
      wgmma_rs_m64n128<1>(*reinterpret_cast<float(*)[64]>(o + 64), pa[kk],
                          advance(v_desc, 2 * kBlockN * 128 + kk * 16 * 128), 1);
    } else if constexpr (D == 128) {
      wgmma_rs_m64n128<1>(o, pa[kk], b, 1);
    } else {
      wgmma_rs_m64n64<1>(o, pa[kk], b, 1);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(o);
  fence_registers(pa);
}

// O /= l and lse = (m + log2 l) ln 2 of this thread's two query rows (O's first p.head_dim_v <= D columns).
template <int D>
__device__ __forceinline__ void store_o_lse(const ForwardArgs& p, const float (&o)[D / 2],
                                            const float (&row_max)[2], const float (&row_sum)[2],
                                            const int (&q_row)[2], int64_t batch_token0, int batch, int head,
                                            int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int row = q_row[r];
    if (row >= p.seq_len) continue;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    __nv_bfloat16* o_row = p.o + (batch_token0 + row) * p.o_stride + int64_t(head) * p.head_dim_v;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      // Columns past the head dim (a tile zero-padded to D) are not stored; the first 64 always exist.
      if (i >= 8 && 8 * i >= p.head_dim_v) break;
      *reinterpret_cast<__nv_bfloat162*>(o_row + 8 * i + 2 * t) =
          __floats2bfloat162_rn(o[4 * i + 2 * r] * inv, o[4 * i + 2 * r + 1] * inv);
    }
    if (t == 0)
      p.lse[(int64_t(batch) * p.num_heads + head) * p.seq_len + row] =
          (row_max[r] + log2f(sum)) * flash::kLn2;
  }
}

}  // namespace megatune::executor::cuda::hopper
