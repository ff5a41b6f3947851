// One query tile of the Hopper attention backward for one warpgroup's 64 key rows, shared by the kernels of
// flash_attention_hopper_backward.cu (one or two warpgroups, cp.async loads) and
// flash_attention_hopper_backward_ws.cu (warp-specialized, TMA loads). Accumulator layouts: wgmma.cuh.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "executor/cuda/flash_attention_common.cuh"
#include "executor/cuda/flash_attention_hopper.h"
#include "executor/cuda/wgmma.cuh"

namespace megatune::executor::cuda::hopper {

// The warp-specialized backward kernels' launch order over (kv head, batch, key block): under a causal mask
// every head's first key block (the longest) before any second one, so that the short blocks fill the tail;
// without one, the key blocks of one head consecutively, so that the blocks in flight share that head's Q,
// dO and dQ accumulator in L2 (at 32 heads x 4 sequences the other order had each block in flight on a head
// of its own).
inline dim3 backward_grid(const BackwardArgs& p, int key_rows_per_block) {
  const unsigned key_blocks = unsigned((p.seq_len + key_rows_per_block - 1) / key_rows_per_block);
  return p.causal ? dim3(unsigned(p.num_kv_heads), unsigned(p.batch), key_blocks)
                  : dim3(key_blocks, unsigned(p.num_kv_heads), unsigned(p.batch));
}
struct BackwardBlock {
  int group, batch, key_block;
};
__device__ __forceinline__ BackwardBlock backward_block(const BackwardArgs& p) {
  return p.causal ? BackwardBlock{int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)}
                  : BackwardBlock{int(blockIdx.y), int(blockIdx.z), int(blockIdx.x)};
}

// S^T = K Q^T and dP^T = V dO^T (two commit groups, so that P^T = exp2(S^T - lse) overlaps dP^T's product),
// dS^T = P^T o (dP^T - delta) with its bf16 copy stored to ds_tile (row kv_local, columns q; the rows of
// ds_row_base), and dV += P^T dO, dK += dS^T Q issued per 16 query columns with P^T / dS^T from registers
// (pa, dsa; committed, not waited for). k_address / v_address: this warpgroup's 64 rows of the kBlockN-row
// K / V tiles; q_address / do_address: the kBlockM-row Q / dO tiles; lse (base 2) / delta: the tile's rows.
// Masks only where the tile crosses the causal diagonal or the end of the sequence (wg_kv0: this warpgroup's
// first key row). DK: the head-dim columns S^T and dP^T read (the real head dim of tiles zero-padded to D; a
// multiple of 16). DOut: the dV / dK columns this warpgroup accumulates, from 64-column panel out_panel0 of
// dO / Q on (D, or 128 of head dim 256, whose two warpgroups share the key rows and split the columns; then
// only the one with store_ds stores dS^T).
template <int D, int kBlockM, int kBlockN, int DK = D, int DOut = D>
__device__ __forceinline__ void backward_tile_products(
    const BackwardArgs& p, uint32_t k_address, uint32_t v_address, uint32_t q_address, uint32_t do_address,
    const float* lse, const float* delta, __nv_bfloat16* ds_tile, const int (&ds_row_base)[2],
    const int (&kv_row)[2], int kv0, int wg_kv0, int q0, int t, float (&dv)[DOut / 2], float (&dk)[DOut / 2],
    uint32_t (&pa)[kBlockM / 16][4], uint32_t (&dsa)[kBlockM / 16][4], int out_panel0 = 0,
    bool store_ds = true) {
  using flash::fast_exp2;
  using flash::pack_bf16;
  const uint64_t q_desc = mn_major_descriptor(q_address, kBlockM * 128);
  const uint64_t do_desc = mn_major_descriptor(do_address, kBlockM * 128);
  float s[kBlockM / 2], dp[kBlockM / 2];
  wgmma_fence();
  gemm_k_major<DK, kBlockM>(s, k_address, kBlockN, q_address);
  wgmma_commit();
  gemm_k_major<DK, kBlockM>(dp, v_address, kBlockN, do_address);
  wgmma_commit();
  const bool needs_mask =
      (p.causal && wg_kv0 + 63 > q0) || q0 + kBlockM > p.seq_len || kv0 + kBlockN > p.seq_len;
  wgmma_wait<1>();
  fence_registers(s);
  // P^T = exp2(S^T * scale - lse) (lse in base 2); the masked form only on tiles that need it, so that the
  // common tile spends no instructions on masks.
  if (needs_mask) {
#pragma unroll
    for (int i = 0; i < kBlockM / 8; ++i) {
      const float2 lse2 = *reinterpret_cast<const float2*>(lse + 8 * i + 2 * t);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int q = q0 + 8 * i + 2 * t + c;
        const float lse_log2 = c == 0 ? lse2.x : lse2.y;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int e = 4 * i + 2 * r + c;
          const bool visible = q < p.seq_len && kv_row[r] < p.seq_len && !(p.causal && q < kv_row[r]);
          s[e] = visible ? fast_exp2(fmaf(s[e], p.scale_log2, -lse_log2)) : 0.0f;
        }
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < kBlockM / 8; ++i) {
      const float2 lse2 = *reinterpret_cast<const float2*>(lse + 8 * i + 2 * t);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        s[4 * i + 2 * r] = fast_exp2(fmaf(s[4 * i + 2 * r], p.scale_log2, -lse2.x));
        s[4 * i + 2 * r + 1] = fast_exp2(fmaf(s[4 * i + 2 * r + 1], p.scale_log2, -lse2.y));
      }
    }
  }
  wgmma_wait<0>();
  fence_registers(dp);
  // Per 16 query columns: dS^T, its bf16 copy to shared memory for dQ, and the chunk's dV / dK products
  // issued at once, so the tensor cores work on chunk kk while the next chunk is formed.
#pragma unroll
  for (int kk = 0; kk < kBlockM / 16; ++kk) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = 2 * kk + h;
      const float2 delta2 = *reinterpret_cast<const float2*>(delta + 8 * i + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        dp[4 * i + e] = s[4 * i + e] * (dp[4 * i + e] - ((e & 1) ? delta2.y : delta2.x));
      if (store_ds) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          *reinterpret_cast<uint32_t*>(ds_tile + sw128_at<kBlockN>(ds_row_base[r], i)) =
              pack_bf16(dp[4 * i + 2 * r], dp[4 * i + 2 * r + 1]);
        }
      }
    }
    pack_a_fragment(pa[kk], s, 8 * kk);
    pack_a_fragment(dsa[kk], dp, 8 * kk);
    wgmma_fence();
    const uint32_t b_offset = out_panel0 * kBlockM * 128 + kk * 16 * 128;
    const uint64_t b_do = advance(do_desc, b_offset), b_q = advance(q_desc, b_offset);
    if constexpr (DOut == 128) {
      wgmma_rs_m64n128<1>(dv, pa[kk], b_do, 1);
      wgmma_rs_m64n128<1>(dk, dsa[kk], b_q, 1);
    } else {
      wgmma_rs_m64n64<1>(dv, pa[kk], b_do, 1);
      wgmma_rs_m64n64<1>(dk, dsa[kk], b_q, 1);
    }
  }
  wgmma_commit();
}

// dQ panel (64 x 64) = dS K over the kBlockN key rows: A = the dS^T tile read M-major (query panel q_panel),
// B = the K tile read MN-major (head-dim panel d_panel). Committed, not waited for.
template <int kBlockN>
__device__ __forceinline__ void dq_panel_product(float (&dq)[32], uint64_t ds_desc, uint64_t k_mn_desc,
                                                 int q_panel, int d_panel) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    const uint64_t a = advance(ds_desc, q_panel * kBlockN * 128 + kk * 16 * 128);
    const uint64_t b = advance(k_mn_desc, d_panel * kBlockN * 128 + kk * 16 * 128);
    wgmma_ss_m64n64<1, 1>(dq, a, b, kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// 8-byte atomics of one dQ panel straight from the accumulator fragment (each thread holds column pairs
// 8i + 2t, +1 of rows g and g + 8) into the [b, s, n_q, d] accumulator: twice the atomics of a 16-byte form,
// but no lane exchange (the shuffles and selects that pair lanes up stalled the warps: ncu,
// bench/RESULTS.md "attention"). Unguarded when the panel's rows are all inside the sequence.
template <int D>
__device__ __forceinline__ void add_dq_atomics(const BackwardArgs& p, const float (&dq)[32],
                                               int64_t batch_token0, int q0, int head, int q_panel,
                                               int d_panel, int warp, int g, int t) {
  const int q_lo = q0 + q_panel * 64 + 16 * warp + g;
  const bool full = q0 + q_panel * 64 + 64 <= p.seq_len;
  const bool add_lo = full || q_lo < p.seq_len, add_hi = full || q_lo + 8 < p.seq_len;
  float* const dst_lo = p.dq_accum + ((batch_token0 + q_lo) * p.num_heads + head) * D + d_panel * 64 + 2 * t;
  float* const dst_hi = dst_lo + int64_t(8) * p.num_heads * D;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (add_lo) atomicAdd(reinterpret_cast<float2*>(dst_lo + 8 * i), make_float2(dq[4 * i], dq[4 * i + 1]));
    if (add_hi)
      atomicAdd(reinterpret_cast<float2*>(dst_hi + 8 * i), make_float2(dq[4 * i + 2], dq[4 * i + 3]));
  }
}

// One dQ panel through the warpgroup's shared staging tile (64 x 64 fp32; row r's 16-byte chunk c at c ^ (r &
// 7), r & 7 == g: conflict-free fragment stores, and the accumulator's tiled layout) and one 16 KiB bulk
// reduction (cp.reduce.async.bulk .add.f32) by the warpgroup's first thread (issuer) into the tiled
// accumulator (dq_tile_offset), committed as one bulk group. barrier_id: a named barrier of the warpgroup's
// 128 threads. The caller makes sure the previous bulk reduction has read the staging tile before it is
// rewritten (cp.async.bulk.wait_group.read by the issuer, then a barrier).
template <int D>
__device__ __forceinline__ void add_dq_bulk_tile(const BackwardArgs& p, const float (&dq)[32], float* stage,
                                                 int barrier_id, bool issuer, int batch, int head, int q0,
                                                 int q_panel, int d_panel, int warp, int g, int t) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * warp + g + 8 * h;
      *reinterpret_cast<float2*>(stage + r * 64 + (((2 * i + (t >> 1)) ^ g) << 2) + 2 * (t & 1)) =
          make_float2(dq[4 * i + 2 * h], dq[4 * i + 2 * h + 1]);
    }
  }
  fence_async_shared();  // generic stores -> the bulk copy's (async proxy) reads
  asm volatile("bar.sync %0, 128;\n" ::"r"(barrier_id) : "memory");
  if (issuer) {
    // A panel wholly past the sequence's end (head dim 64's second half of a last, short tile) has no tile;
    // its (empty) group is committed all the same, so that the callers' group counting holds.
    if (q0 + 64 * q_panel < p.seq_len) {
      float* dst =
          p.dq_accum + dq_tile_offset(batch, head, q0 / 64 + q_panel, d_panel, p.num_heads, p.seq_len, D);
      asm volatile(
          "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], 16384;\n" ::"l"(dst),
          "r"(shared_address(stage))
          : "memory");
    }
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
  }
}

// dK (scaled) and dV of this thread's two key rows: D accumulated columns from head-dim column col0 on (those
// below p.head_dim).
template <int D>
__device__ __forceinline__ void store_dk_dv(const BackwardArgs& p, const float (&dk)[D / 2],
                                            const float (&dv)[D / 2], const int (&kv_row)[2],
                                            int64_t batch_token0, int group, int t, int col0 = 0) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int kv = kv_row[r];
    if (kv >= p.seq_len) continue;
    __nv_bfloat16* dk_row = p.dk + (batch_token0 + kv) * p.kv_stride + int64_t(group) * p.head_dim + col0;
    __nv_bfloat16* dv_row = p.dv + (batch_token0 + kv) * p.kv_stride + int64_t(group) * p.head_dim + col0;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      if (i >= 8 && col0 + 8 * i >= p.head_dim) break;  // a tile zero-padded to D: its padded columns
      const int col = 8 * i + 2 * t;
      *reinterpret_cast<__nv_bfloat162*>(dk_row + col) =
          __floats2bfloat162_rn(dk[4 * i + 2 * r] * p.scale, dk[4 * i + 2 * r + 1] * p.scale);
      *reinterpret_cast<__nv_bfloat162*>(dv_row + col) =
          __floats2bfloat162_rn(dv[4 * i + 2 * r], dv[4 * i + 2 * r + 1]);
    }
  }
}

}  // namespace megatune::executor::cuda::hopper
