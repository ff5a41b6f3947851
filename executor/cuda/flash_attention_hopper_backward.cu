// Flash attention backward on Hopper tensor cores (wgmma, sm_90a). A block of one or two warpgroups owns 64
// key rows per warpgroup of one (batch, kv head) and walks the query tiles of every head in its group
// (64 query rows for head dim 128, 128 for head dim 64). One warpgroup per block runs two blocks per SM that
// drift apart, so one block's exponentials and atomics overlap the other's matrix products; two warpgroups
// per block share the Q/dO tiles and halve dQ's atomics per key row but run in lockstep. Per tile, each
// warpgroup computes S^T = K Q^T and dP^T = V dO^T from shared memory, forms P^T = exp2(S^T - lse) and dS^T =
// P^T o (dP^T - delta) on the accumulators, adds dV += P^T dO and dK += dS^T Q with P^T / dS^T straight from
// registers, and stores dS^T to shared memory; then dQ = dS K (64 x 64 per warpgroup, both operands MN-major)
// goes to the fp32 accumulator with 8-byte atomics, or (kDqBulkTiles) through a shared staging tile and one
// bulk reduction per panel. Q, dO, lse and delta are double-buffered (cp.async).
#include <stdexcept>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/flash_attention_common.cuh"
#include "executor/cuda/flash_attention_hopper.h"
#include "executor/cuda/flash_attention_hopper_backward_tile.cuh"
#include "executor/cuda/wgmma.cuh"

namespace megatune::executor::cuda::hopper {
namespace {

using bf16 = __nv_bfloat16;
using flash::fast_exp2;
using flash::pack_bf16;

template <int D, int kWarpGroups>
struct Tile {
  static constexpr int kBlockN = 64 * kWarpGroups;  // key rows per block
  static constexpr int kThreads = 128 * kWarpGroups;
  static constexpr int kBlockM = D == 64 ? 128 : 64;  // query rows per step
  static constexpr int kSmemBytes =
      (2 * kBlockN * D + 4 * kBlockM * D + kBlockN * kBlockM) * int(sizeof(bf16)) + 4 * kBlockM * 4 + 1024;
  // kDqBulkTiles: two staging tiles (64 x 64 fp32) per warpgroup, one per iteration parity.
  static constexpr int kStageBytes = 2 * kWarpGroups * 64 * 64 * 4;
};

// kDqMode kDqBulkTiles (flash_attention_hopper.h; two warpgroups only): each warpgroup stores its dQ panel to
// a shared staging tile (swizzled 16-byte chunks, the accumulator's tiled layout), and its first thread hands
// the 16 KiB tile to the TMA unit as one bulk reduction (cp.reduce.async.bulk .add.f32) that adds it in L2
// while the warpgroup moves on. A staging tile is rewritten two iterations later, after that thread saw its
// reads finish (cp.async.bulk.wait_group.read 1 before the loop's block barrier).
template <int D, int kWarpGroups, int kDqMode>
__global__ void __launch_bounds__(Tile<D, kWarpGroups>::kThreads, 3 - kWarpGroups)
    flash_backward_hopper_kernel(const BackwardArgs p) {
  constexpr bool kBulkDq = kDqMode == kDqBulkTiles;
  static_assert(!kBulkDq || kWarpGroups == 2, "bulk dQ needs one panel per warpgroup");
  using T = Tile<D, kWarpGroups>;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kThreads = T::kThreads;
  extern __shared__ unsigned char smem_raw[];
  bf16* k_tile = reinterpret_cast<bf16*>(align_1024(smem_raw));          // sw128 [kBlockN][D]
  bf16* v_tile = k_tile + kBlockN * D;                                   // sw128 [kBlockN][D]
  bf16* q_tiles = v_tile + kBlockN * D;                                  // [2] sw128 [kBlockM][D]
  bf16* do_tiles = q_tiles + 2 * kBlockM * D;                            // [2] sw128 [kBlockM][D]
  bf16* ds_tile = do_tiles + 2 * kBlockM * D;                            // sw128 [kBlockN (kv)][kBlockM (q)]
  float* stats = reinterpret_cast<float*>(ds_tile + kBlockN * kBlockM);  // [2][lse, delta][kBlockM]
  float* dq_stage = stats + 4 * kBlockM;  // kDqBulkTiles: [2 parities][kWarpGroups][64 x 64] fp32

  // Longest first: grid (kv heads, batch, key blocks), so every head's key block 0 starts before block 1.
  const int group = blockIdx.x, batch = blockIdx.y, n_block = blockIdx.z;
  const int heads_per_group = p.num_heads / p.num_kv_heads;
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int kv0 = n_block * kBlockN;
  const int64_t batch_token0 = int64_t(batch) * p.seq_len;

  load_tile_sw128<kBlockN, D, kThreads>(k_tile, p.k + batch_token0 * p.kv_stride + int64_t(group) * D,
                                        p.kv_stride, kv0, p.seq_len);
  load_tile_sw128<kBlockN, D, kThreads>(v_tile, p.v + batch_token0 * p.kv_stride + int64_t(group) * D,
                                        p.kv_stride, kv0, p.seq_len);

  const int m_tiles = (p.seq_len + kBlockM - 1) / kBlockM;
  const int m_first = p.causal ? kv0 / kBlockM : 0;
  const int per_head = m_tiles - m_first;
  const int iterations = per_head * heads_per_group;

  auto issue_loads = [&](int it, int buffer) {
    const int head = group * heads_per_group + it / per_head;
    const int q0 = (m_first + it % per_head) * kBlockM;
    load_tile_sw128<kBlockM, D, kThreads>(q_tiles + buffer * kBlockM * D,
                                          p.q + batch_token0 * p.q_stride + int64_t(head) * D, p.q_stride, q0,
                                          p.seq_len);
    load_tile_sw128<kBlockM, D, kThreads>(do_tiles + buffer * kBlockM * D,
                                          p.d_o + batch_token0 * p.o_stride + int64_t(head) * D, p.o_stride,
                                          q0, p.seq_len);
    const int64_t stats0 = (int64_t(batch) * p.num_heads + head) * p.seq_len;
    for (int i = threadIdx.x; i < 2 * kBlockM; i += kThreads) {
      const int q = q0 + (i % kBlockM);
      const float* src = (i < kBlockM ? p.lse : p.delta) + stats0 + (q < p.seq_len ? q : 0);
      const uint32_t dst = shared_address(stats + buffer * 2 * kBlockM + i);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                   "r"(q < p.seq_len ? 4 : 0));
    }
  };
  if (iterations > 0) issue_loads(0, 0);
  flash::cp_async_commit();

  float dv[D / 2], dk[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dv[i] = dk[i] = 0.0f;
  const int kv_local[2] = {64 * wg + 16 * warp + g, 64 * wg + 16 * warp + g + 8};
  const int kv_row[2] = {kv0 + kv_local[0], kv0 + kv_local[1]};
  const uint32_t k_address = shared_address(k_tile), v_address = shared_address(v_tile);
  const uint32_t ds_address = shared_address(ds_tile);
  // Descriptors of the dQ product's operands (fixed tiles) and this thread's dS^T store rows.
  const uint64_t ds_desc = mn_major_descriptor(ds_address, kBlockN * 128);
  const uint64_t k_mn_desc = mn_major_descriptor(k_address, kBlockN * 128);
  const int ds_row_base[2] = {sw128_row_base(kv_local[0], 2 * t), sw128_row_base(kv_local[1], 2 * t)};
  // dQ in 64 x 64 panels: head dim 64 -> panels of 64 of the 128 query rows; 128 -> 64 of the head-dim
  // columns. Two warpgroups take one panel each, one warpgroup both.
  constexpr int kPanelsPerWarpGroup = 2 / kWarpGroups;
  // Bulk dQ: the panel's fragment (rows 16 warp + g (+8), columns 8i + 2t (+1)) into staging tile `slot` (row
  // r's 16-byte chunk c at c ^ (r & 7), r & 7 == g), then one bulk reduction of the tile by the warpgroup's
  // first thread.
  const bool bulk_issuer = (threadIdx.x & 127) == 0;

  for (int it = 0; it < iterations; ++it) {
    // Bulk dQ: this iteration's staging tiles were last read by the bulk reduction of iteration it - 2.
    if constexpr (kBulkDq) {
      if (bulk_issuer) asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
    }
    flash::cp_async_wait<0>();
    fence_async_shared();
    __syncthreads();
    if (it + 1 < iterations) issue_loads(it + 1, (it + 1) & 1);
    flash::cp_async_commit();
    const int head = group * heads_per_group + it / per_head;
    const int q0 = (m_first + it % per_head) * kBlockM;
    const uint32_t q_address = shared_address(q_tiles + (it & 1) * kBlockM * D);
    const uint32_t do_address = shared_address(do_tiles + (it & 1) * kBlockM * D);
    const float* lse = stats + (it & 1) * 2 * kBlockM;
    const float* delta = lse + kBlockM;
    uint32_t pa[kBlockM / 16][4], dsa[kBlockM / 16][4];
    backward_tile_products<D, kBlockM, kBlockN>(p, k_address + 64 * wg * 128, v_address + 64 * wg * 128,
                                                q_address, do_address, lse, delta, ds_tile, ds_row_base,
                                                kv_row, kv0, kv0 + 64 * wg, q0, t, dv, dk, pa, dsa);
    if constexpr (kWarpGroups == 1) {
      // The dQ panels need registers: let dV/dK finish with P^T / dS^T first.
      wgmma_wait<0>();
      fence_registers(dv);
      fence_registers(dk);
      fence_registers(pa);
      fence_registers(dsa);
    }
    fence_async_shared();
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kPanelsPerWarpGroup; ++j) {
      const int panel = wg + j;  // wg is 0 when one warpgroup takes both panels
      const int q_panel = kBlockM == 128 ? panel : 0, d_panel = kBlockM == 64 ? panel : 0;
      // dQ panel (64 x 64) = dS K: A = dS^T tile read M-major, B = K tile read MN-major.
      float dq[32];
      dq_panel_product<kBlockN>(dq, ds_desc, k_mn_desc, q_panel, d_panel);
      wgmma_wait<0>();
      fence_registers(dq);
      if constexpr (kWarpGroups == 2) {
        fence_registers(dv);
        fence_registers(dk);
        fence_registers(pa);
        fence_registers(dsa);
      }
      if constexpr (kBulkDq) {
        add_dq_bulk_tile<D>(p, dq, dq_stage + ((it & 1) * kWarpGroups + wg) * 64 * 64, 1 + wg, bulk_issuer,
                            batch, head, q0, q_panel, d_panel, warp, g, t);
      } else {
        add_dq_atomics<D>(p, dq, batch_token0, q0, head, q_panel, d_panel, warp, g, t);
      }
    }
  }

  if constexpr (kBulkDq) {  // the staging tiles stay allocated until the bulk reductions are done
    if (bulk_issuer) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  }

  store_dk_dv<D>(p, dk, dv, kv_row, batch_token0, group, t);
}

template <int D, int kWarpGroups, int kDqMode>
void launch(const BackwardArgs& args, cudaStream_t stream) {
  using T = Tile<D, kWarpGroups>;
  constexpr int smem = T::kSmemBytes + (kDqMode == kDqBulkTiles ? T::kStageBytes : 0);
  static bool configured = false;
  if (!configured) {
    MEGATUNE_CUDA_CHECK(cudaFuncSetAttribute(flash_backward_hopper_kernel<D, kWarpGroups, kDqMode>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = true;
  }
  const dim3 grid(unsigned(args.num_kv_heads), unsigned(args.batch),
                  unsigned((args.seq_len + T::kBlockN - 1) / T::kBlockN));
  flash_backward_hopper_kernel<D, kWarpGroups, kDqMode><<<grid, T::kThreads, smem, stream>>>(args);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

template <int D>
void launch_head_dim(const BackwardArgs& args, int warpgroups_per_block, int dq_mode, cudaStream_t stream) {
  if (warpgroups_per_block == 1) return launch<D, 1, kDqAtomics>(args, stream);
  if (dq_mode == kDqBulkTiles) return launch<D, 2, kDqBulkTiles>(args, stream);
  launch<D, 2, kDqAtomics>(args, stream);
}

}  // namespace

void launch_backward(const BackwardArgs& args, int warpgroups_per_block, int dq_mode, cudaStream_t stream) {
  if (warpgroups_per_block != 1 && warpgroups_per_block != 2)
    throw std::invalid_argument("hopper::launch_backward: warpgroups_per_block must be 1 or 2");
  if (dq_mode != kDqAtomics && dq_mode != kDqBulkTiles)
    throw std::invalid_argument("hopper::launch_backward: unknown dQ mode");
  if (dq_mode != kDqAtomics && warpgroups_per_block != 2)
    throw std::invalid_argument("hopper::launch_backward: bulk dQ needs two warpgroups per block");
  if (args.head_dim != 64 && args.head_dim != 128)
    throw std::invalid_argument("hopper::launch_backward: head dim 64 or 128 (80, 96: warp-specialized)");
  if (args.head_dim == 64)
    launch_head_dim<64>(args, warpgroups_per_block, dq_mode, stream);
  else
    launch_head_dim<128>(args, warpgroups_per_block, dq_mode, stream);
}

}  // namespace megatune::executor::cuda::hopper
