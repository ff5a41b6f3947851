// Warp-specialized flash attention backward on Hopper (sm_90a) for head dim 256, where one warpgroup cannot
// hold dK and dV of its key rows (64 x 256 each: 256 registers per thread). A block owns 64 key rows of one
// (batch, kv head); as in flash_attention_hopper_backward_ws.cu warpgroup 0 is the TMA producer (K, V once;
// Q, dO and lse / delta per query tile of 64 rows into a 2-stage ring) and warpgroups 1 and 2 consume, but
// the two consumers share the block's key rows and split the head-dim columns: each forms the whole S^T = K
// Q^T and dP^T = V dO^T (64 x 64 over the 256 columns) and with them P^T and dS^T, then accumulates its 128
// columns of dV += P^T dO and dK += dS^T Q, and adds its 128 columns of dQ = dS K (two 64 x 64 panels, 8-byte
// atomics into the row layout). The score products are formed twice: 7 products per tile where the division
// by key rows would have 5, the price of fitting the accumulators (FlashAttention-3 splits hdim 256 the same
// way). The first consumer stores the bf16 dS^T tile that both read for dQ (double-buffered, one named
// barrier per tile).
#include <cuda/ptx>
#include <stdexcept>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/flash_attention_common.cuh"
#include "executor/cuda/flash_attention_hopper.h"
#include "executor/cuda/flash_attention_hopper_backward_tile.cuh"
#include "executor/cuda/tma.cuh"
#include "executor/cuda/tma.h"
#include "executor/cuda/wgmma.cuh"

namespace megatune::executor::cuda::hopper {
namespace {

using bf16 = __nv_bfloat16;

struct WideTile {
  static constexpr int D = 256;
  static constexpr int kStages = 2;
  static constexpr int kBlockN = 64;    // key rows per block, shared by both consumers
  static constexpr int kBlockM = 64;    // query rows per tile
  static constexpr int kColumns = 128;  // dK / dV / dQ columns per consumer
  // Offsets (bytes) from the 1024-aligned base; every tile starts 1024-aligned. 210 KiB in all.
  static constexpr int kK = 0;                                    // sw128 [kBlockN][D]
  static constexpr int kV = kK + kBlockN * D * 2;                 // sw128 [kBlockN][D]
  static constexpr int kQ = kV + kBlockN * D * 2;                 // [kStages] sw128 [kBlockM][D]
  static constexpr int kDo = kQ + kStages * kBlockM * D * 2;      // [kStages] sw128 [kBlockM][D]
  static constexpr int kDs = kDo + kStages * kBlockM * D * 2;     // [2] sw128 [kBlockN (kv)][kBlockM (q)]
  static constexpr int kStats = kDs + 2 * kBlockN * kBlockM * 2;  // [kStages][lse, delta][kBlockM] fp32
  static constexpr int kBarriers = kStats + kStages * 2 * kBlockM * 4;  // kv_full, full[2], empty[2]
  static constexpr int kSmemBytes = kBarriers + (1 + 2 * kStages) * 8 + 1024;
  static constexpr uint32_t kStageTxBytes = 2 * kBlockM * D * 2;  // Q and dO of one tile
  static constexpr uint32_t kKvTxBytes = 2 * kBlockN * D * 2;
};

struct WideMaps {
  CUtensorMap q, d_o, k, v;
};

// The producer warp: K and V once, then per iteration (head of the group, query tile) Q and dO by TMA and the
// tile's lse / delta by ordinary loads (rows past the sequence get 0: their P is masked).
__device__ __forceinline__ void produce(const BackwardArgs& p, const WideMaps& maps, unsigned char* base,
                                        int group, int batch, int kv0, int m_first, int per_head,
                                        int iterations) {
  using T = WideTile;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, D = T::D, kStages = T::kStages;
  bf16* q_tiles = reinterpret_cast<bf16*>(base + T::kQ);
  bf16* do_tiles = reinterpret_cast<bf16*>(base + T::kDo);
  float* stats = reinterpret_cast<float*>(base + T::kStats);
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(base + T::kBarriers);
  uint64_t* full = kv_full + 1;
  uint64_t* empty = full + kStages;
  const int lane = threadIdx.x, heads_per_group = p.num_heads / p.num_kv_heads;
  const int64_t batch_token0 = int64_t(batch) * p.seq_len;
  if (iterations > 0 && lane == 0) {
    ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                           ::cuda::ptx::space_shared, kv_full, uint32_t(T::kKvTxBytes));
    tma_tile<kBlockN, D>(reinterpret_cast<bf16*>(base + T::kK), &maps.k, group, int(batch_token0) + kv0,
                         kv_full);
    tma_tile<kBlockN, D>(reinterpret_cast<bf16*>(base + T::kV), &maps.v, group, int(batch_token0) + kv0,
                         kv_full);
  }
  for (int it = 0; it < iterations; ++it) {
    const int s = it % kStages;
    if (it >= kStages) wait_parity(empty + s, ((it / kStages) & 1) ^ 1);
    const int head = group * heads_per_group + it / per_head;
    const int q0 = (m_first + it % per_head) * kBlockM;
    if (lane == 0) {
      ::cuda::ptx::mbarrier_expect_tx(::cuda::ptx::sem_relaxed, ::cuda::ptx::scope_cta,
                                      ::cuda::ptx::space_shared, full + s, uint32_t(T::kStageTxBytes));
      tma_tile<kBlockM, D>(q_tiles + s * kBlockM * D, &maps.q, head, int(batch_token0) + q0, full + s);
      tma_tile<kBlockM, D>(do_tiles + s * kBlockM * D, &maps.d_o, head, int(batch_token0) + q0, full + s);
    }
    const int64_t stats0 = (int64_t(batch) * p.num_heads + head) * p.seq_len;
    float* stage_stats = stats + s * 2 * kBlockM;
#pragma unroll
    for (int i = lane; i < 2 * kBlockM; i += 32) {
      const int q = q0 + (i % kBlockM);
      stage_stats[i] = q < p.seq_len ? (i < kBlockM ? p.lse : p.delta)[stats0 + q] : 0.0f;
    }
    ::cuda::ptx::mbarrier_arrive(full + s);
  }
}

__global__ void __launch_bounds__(384, 1) flash_backward_wide_kernel(const __grid_constant__ BackwardArgs p,
                                                                     const __grid_constant__ WideMaps maps) {
  using T = WideTile;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, D = T::D, kStages = T::kStages;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = align_1024(smem_raw);
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(base + T::kBarriers);
  uint64_t* full = kv_full + 1;
  uint64_t* empty = full + kStages;

  const BackwardBlock block = backward_block(p);
  const int group = block.group, batch = block.batch, kv0 = block.key_block * kBlockN;
  const int m_tiles = (p.seq_len + kBlockM - 1) / kBlockM;
  const int m_first = p.causal ? kv0 / kBlockM : 0;
  const int per_head = m_tiles - m_first;
  const int iterations = per_head * (p.num_heads / p.num_kv_heads);
  const int role = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);

  if (threadIdx.x == 0) {
    ::cuda::ptx::mbarrier_init(kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      ::cuda::ptx::mbarrier_init(full + s, 32);  // the producer warp's lanes, after their lse / delta stores
      ::cuda::ptx::mbarrier_init(empty + s, 8);  // one lane per consumer warp
    }
    ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
  }
  __syncthreads();

  if (role == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x < 32) produce(p, maps, base, group, batch, kv0, m_first, per_head, iterations);
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int wg = role - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int heads_per_group = p.num_heads / p.num_kv_heads;
  const int64_t batch_token0 = int64_t(batch) * p.seq_len;
  float dv[T::kColumns / 2], dk[T::kColumns / 2];
#pragma unroll
  for (int i = 0; i < T::kColumns / 2; ++i) dv[i] = dk[i] = 0.0f;
  const int kv_local[2] = {16 * warp + g, 16 * warp + g + 8};
  const int kv_row[2] = {kv0 + kv_local[0], kv0 + kv_local[1]};
  const uint32_t k_address = shared_address(base + T::kK), v_address = shared_address(base + T::kV);
  const uint64_t k_mn_desc = mn_major_descriptor(k_address, kBlockN * 128);
  const int ds_row_base[2] = {sw128_row_base(kv_local[0], 2 * t), sw128_row_base(kv_local[1], 2 * t)};
  const int out_panel0 = 2 * wg;  // this consumer's first 64-column panel of dK, dV, dQ
  if (iterations > 0) wait_parity(kv_full, 0);

  for (int it = 0; it < iterations; ++it) {
    const int s = it % kStages;
    const int head = group * heads_per_group + it / per_head;
    const int q0 = (m_first + it % per_head) * kBlockM;
    const uint32_t q_address = shared_address(base + T::kQ + s * kBlockM * D * 2);
    const uint32_t do_address = shared_address(base + T::kDo + s * kBlockM * D * 2);
    bf16* ds_tile = reinterpret_cast<bf16*>(base + T::kDs) + (it & 1) * kBlockN * kBlockM;
    const uint64_t ds_desc = mn_major_descriptor(shared_address(ds_tile), kBlockN * 128);
    const float* lse = reinterpret_cast<const float*>(base + T::kStats) + s * 2 * kBlockM;
    wait_parity(full + s, (it / kStages) & 1);
    uint32_t pa[kBlockM / 16][4], dsa[kBlockM / 16][4];
    backward_tile_products<D, kBlockM, kBlockN, D, T::kColumns>(
        p, k_address, v_address, q_address, do_address, lse, lse + kBlockM, ds_tile, ds_row_base, kv_row, kv0,
        kv0, q0, t, dv, dk, pa, dsa, out_panel0, wg == 0);
    fence_async_shared();                             // dS^T (generic stores) -> the dQ product (async proxy)
    asm volatile("bar.sync 1, 256;\n" ::: "memory");  // the first consumer's dS^T is in place
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float dq[32];
      dq_panel_product<kBlockN>(dq, ds_desc, k_mn_desc, 0, out_panel0 + j);
      wgmma_wait<0>();
      fence_registers(dq);
      fence_registers(dv);
      fence_registers(dk);
      fence_registers(pa);
      fence_registers(dsa);
      if (j == 0) {  // this warp is done with stage s (every product reading Q / dO has completed)
        __syncwarp();
        if (lane == 0) ::cuda::ptx::mbarrier_arrive(empty + s);
      }
      add_dq_atomics<D>(p, dq, batch_token0, q0, head, 0, out_panel0 + j, warp, g, t);
    }
  }
  store_dk_dv<T::kColumns>(p, dk, dv, kv_row, batch_token0, group, t, T::kColumns * wg);
}

}  // namespace

void launch_backward_wide(const BackwardArgs& args, cudaStream_t stream) {
  using T = WideTile;
  if (args.head_dim != T::D)
    throw std::invalid_argument("flash attention backward: the wide wgmma kernel takes head dim 256");
  if (!warp_specialized_takes(int64_t(args.batch) * args.seq_len))
    throw std::invalid_argument("flash attention backward: the wide wgmma kernel needs b * s < 2^31");
  static bool configured = false;
  if (!configured) {
    MEGATUNE_CUDA_CHECK(cudaFuncSetAttribute(flash_backward_wide_kernel,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
    configured = true;
  }
  const int64_t rows = int64_t(args.batch) * args.seq_len;
  const WideMaps maps{
      make_bf16_head_tile_map(args.q, rows, args.num_heads, T::D, args.q_stride, T::kBlockM),
      make_bf16_head_tile_map(args.d_o, rows, args.num_heads, T::D, args.o_stride, T::kBlockM),
      make_bf16_head_tile_map(args.k, rows, args.num_kv_heads, T::D, args.kv_stride, T::kBlockN),
      make_bf16_head_tile_map(args.v, rows, args.num_kv_heads, T::D, args.kv_stride, T::kBlockN)};
  const dim3 grid = backward_grid(args, T::kBlockN);
  flash_backward_wide_kernel<<<grid, 384, T::kSmemBytes, stream>>>(args, maps);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace megatune::executor::cuda::hopper
