// Warp-specialized flash attention backward on Hopper (sm_90a), FlashAttention-3's division of labour: a
// block of three warpgroups owns 128 key rows of one (batch, kv head). Warpgroup 0 is the producer: it gives
// up registers (setmaxnreg.dec 24), and its first warp streams every query tile's Q and dO into a ring of
// shared-memory stages with the TMA unit (cp.async.bulk.tensor, 128-byte swizzle: the sw128 layout of
// wgmma.cuh; K and V once, the same way) and lse / delta with ordinary loads, signalling each stage's
// mbarrier; its other warps exit. Warpgroups 1 and 2 are the consumers (setmaxnreg.inc 240), 64 key rows
// each, and do what the two-warpgroup kernel of flash_attention_hopper_backward.cu does per tile (S^T, dP^T,
// P^T, dS^T, dV and dK from registers, dQ = dS K with 8-byte atomics) without loading anything: they wait on
// the stage's "full" mbarrier and release it through its "empty" mbarrier, and meet each other once per tile
// (a named barrier over the 256 consumer threads: dQ needs both halves of dS^T, which is double-buffered so
// that no second meeting is needed before it is rewritten). Head dims 80 and 96 run the head dim 128 kernel
// on Q / K / V / dO tiles the TMA unit zero-pads to 128 columns: S and dP are unchanged, the padded columns
// of dK / dV are not stored, and dQ's tiled accumulator is 128 columns wide (its conversion skips them).
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

constexpr int kConsumerThreads = 256;

// kStages: Q / dO stages in flight (2 or 3); kBulkDq: dQ through a staging tile per consumer warpgroup and
// one bulk reduction per tile into the tiled accumulator (hopper::dq_tile_offset) instead of atomics.
template <int D, int kStages, bool kBulkDq>
struct WsTile {
  static constexpr int kBlockN = 128;                 // key rows per block, 64 per consumer warpgroup
  static constexpr int kBlockM = D == 64 ? 128 : 64;  // query rows per tile
  // Offsets (bytes) from the 1024-aligned base; every tile starts 1024-aligned.
  static constexpr int kK = 0;
  static constexpr int kV = kK + kBlockN * D * 2;
  static constexpr int kQ = kV + kBlockN * D * 2;                 // [kStages] sw128 [kBlockM][D]
  static constexpr int kDo = kQ + kStages * kBlockM * D * 2;      // [kStages] sw128 [kBlockM][D]
  static constexpr int kDs = kDo + kStages * kBlockM * D * 2;     // [2] sw128 [kBlockN (kv)][kBlockM (q)]
  static constexpr int kStats = kDs + 2 * kBlockN * kBlockM * 2;  // [kStages][lse, delta][kBlockM] fp32
  static constexpr int kBarriers =
      kStats + kStages * 2 * kBlockM * 4;  // kv_full, full[kStages], empty[kStages]
  static constexpr int kStage = (kBarriers + (1 + 2 * kStages) * 8 + 127) / 128 * 128;  // [2][64 x 64] fp32
  static constexpr int kSmemBytes = kStage + (kBulkDq ? 2 * 64 * 64 * 4 : 0) + 1024;
  static constexpr uint32_t kStageTxBytes = 2 * kBlockM * D * 2;  // Q and dO of one tile
  static constexpr uint32_t kKvTxBytes = 2 * kBlockN * D * 2;
};

struct WsMaps {
  CUtensorMap q, d_o, k, v;
};

__device__ __forceinline__ void consumer_barrier() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumerThreads) : "memory");
}

// DK: the head-dim columns of S^T and dP^T (80 or 96 on tiles zero-padded to D = 128; else D).
template <int D, int kStages, bool kBulkDq, int DK = D>
__global__ void __launch_bounds__(384, 1)
    flash_backward_ws_kernel(const __grid_constant__ BackwardArgs p, const __grid_constant__ WsMaps maps) {
  using T = WsTile<D, kStages, kBulkDq>;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = align_1024(smem_raw);
  bf16* k_tile = reinterpret_cast<bf16*>(base + T::kK);
  bf16* v_tile = reinterpret_cast<bf16*>(base + T::kV);
  bf16* q_tiles = reinterpret_cast<bf16*>(base + T::kQ);
  bf16* do_tiles = reinterpret_cast<bf16*>(base + T::kDo);
  bf16* ds_tiles = reinterpret_cast<bf16*>(base + T::kDs);
  float* stats = reinterpret_cast<float*>(base + T::kStats);
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(base + T::kBarriers);
  uint64_t* full = kv_full + 1;
  uint64_t* empty = full + kStages;
  float* dq_stage = reinterpret_cast<float*>(base + T::kStage);  // kBulkDq: one 64 x 64 tile per consumer

  const BackwardBlock block = backward_block(p);
  const int group = block.group, batch = block.batch, n_block = block.key_block;
  const int heads_per_group = p.num_heads / p.num_kv_heads;
  const int kv0 = n_block * kBlockN;
  const int m_tiles = (p.seq_len + kBlockM - 1) / kBlockM;
  const int m_first = p.causal ? kv0 / kBlockM : 0;
  const int per_head = m_tiles - m_first;
  const int iterations = per_head * heads_per_group;
  const int64_t batch_token0 = int64_t(batch) * p.seq_len;
  // The role as a warp-uniform value, so that ptxas sees uniform branches around setmaxnreg and wgmma.
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
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    if (iterations > 0 && lane == 0) {
      ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                             ::cuda::ptx::space_shared, kv_full, uint32_t(T::kKvTxBytes));
      tma_tile<kBlockN, D>(k_tile, &maps.k, group, int(batch_token0) + kv0, kv_full);
      tma_tile<kBlockN, D>(v_tile, &maps.v, group, int(batch_token0) + kv0, kv_full);
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
      // lse (base 2) and delta of the tile's query rows; rows past the sequence get 0 (their P is masked).
      const int64_t stats0 = (int64_t(batch) * p.num_heads + head) * p.seq_len;
      float* stage_stats = stats + s * 2 * kBlockM;
#pragma unroll
      for (int i = lane; i < 2 * kBlockM; i += 32) {
        const int q = q0 + (i % kBlockM);
        stage_stats[i] = q < p.seq_len ? (i < kBlockM ? p.lse : p.delta)[stats0 + q] : 0.0f;
      }
      ::cuda::ptx::mbarrier_arrive(full + s);
    }
    return;
  }

  // Consumers.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int wg = role - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  float dv[D / 2], dk[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dv[i] = dk[i] = 0.0f;
  const int kv_local[2] = {64 * wg + 16 * warp + g, 64 * wg + 16 * warp + g + 8};
  const int kv_row[2] = {kv0 + kv_local[0], kv0 + kv_local[1]};
  const uint32_t k_address = shared_address(k_tile), v_address = shared_address(v_tile);
  const uint64_t k_mn_desc = mn_major_descriptor(k_address, kBlockN * 128);
  const int ds_row_base[2] = {sw128_row_base(kv_local[0], 2 * t), sw128_row_base(kv_local[1], 2 * t)};
  // dQ in 64 x 64 panels, one per warpgroup: head dim 64 -> query rows 64 wg..; 128 -> head-dim columns.
  const int q_panel = kBlockM == 128 ? wg : 0, d_panel = kBlockM == 64 ? wg : 0;
  const bool bulk_issuer = (threadIdx.x & 127) == 0;
  if (iterations > 0) wait_parity(kv_full, 0);

  for (int it = 0; it < iterations; ++it) {
    const int s = it % kStages;
    const int head = group * heads_per_group + it / per_head;
    const int q0 = (m_first + it % per_head) * kBlockM;
    const uint32_t q_address = shared_address(q_tiles + s * kBlockM * D);
    const uint32_t do_address = shared_address(do_tiles + s * kBlockM * D);
    bf16* ds_tile = ds_tiles + (it & 1) * kBlockN * kBlockM;
    const uint64_t ds_desc = mn_major_descriptor(shared_address(ds_tile), kBlockN * 128);
    const float* lse = stats + s * 2 * kBlockM;
    const float* delta = lse + kBlockM;
    wait_parity(full + s, (it / kStages) & 1);
    uint32_t pa[kBlockM / 16][4], dsa[kBlockM / 16][4];
    backward_tile_products<D, kBlockM, kBlockN, DK>(p, k_address + 64 * wg * 128, v_address + 64 * wg * 128,
                                                    q_address, do_address, lse, delta, ds_tile, ds_row_base,
                                                    kv_row, kv0, kv0 + 64 * wg, q0, t, dv, dk, pa, dsa);
    fence_async_shared();  // dS^T (generic stores) -> the dQ product (async proxy)
    // Bulk dQ: the staging tile was last read by the bulk reduction of iteration it - 1.
    if constexpr (kBulkDq) {
      if (bulk_issuer) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    }
    consumer_barrier();  // both warpgroups' halves of dS^T are in place
    float dq[32];
    dq_panel_product<kBlockN>(dq, ds_desc, k_mn_desc, q_panel, d_panel);
    wgmma_wait<0>();
    fence_registers(dq);
    fence_registers(dv);
    fence_registers(dk);
    fence_registers(pa);
    fence_registers(dsa);
    // This warp is done with stage s (its products have completed; its lse / delta reads are behind it).
    __syncwarp();
    if (lane == 0) ::cuda::ptx::mbarrier_arrive(empty + s);
    if constexpr (kBulkDq)
      add_dq_bulk_tile<D>(p, dq, dq_stage + wg * 64 * 64, 2 + wg, bulk_issuer, batch, head, q0, q_panel,
                          d_panel, warp, g, t);
    else
      add_dq_atomics<D>(p, dq, batch_token0, q0, head, q_panel, d_panel, warp, g, t);
  }

  if constexpr (kBulkDq) {  // the staging tile stays allocated until the last bulk reduction is done
    if (bulk_issuer) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  }
  store_dk_dv<D>(p, dk, dv, kv_row, batch_token0, group, t);
}

template <int D, int kStages, bool kBulkDq, int DK = D>
void launch_ws(const BackwardArgs& args, cudaStream_t stream) {
  using T = WsTile<D, kStages, kBulkDq>;
  static bool configured = false;
  if (!configured) {
    MEGATUNE_CUDA_CHECK(cudaFuncSetAttribute(flash_backward_ws_kernel<D, kStages, kBulkDq, DK>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
    configured = true;
  }
  const int64_t rows = int64_t(args.batch) * args.seq_len;
  const WsMaps maps{
      make_bf16_head_tile_map(args.q, rows, args.num_heads, args.head_dim, args.q_stride, T::kBlockM),
      make_bf16_head_tile_map(args.d_o, rows, args.num_heads, args.head_dim, args.o_stride, T::kBlockM),
      make_bf16_head_tile_map(args.k, rows, args.num_kv_heads, args.head_dim, args.kv_stride, T::kBlockN),
      make_bf16_head_tile_map(args.v, rows, args.num_kv_heads, args.head_dim, args.kv_stride, T::kBlockN)};
  const dim3 grid = backward_grid(args, T::kBlockN);
  flash_backward_ws_kernel<D, kStages, kBulkDq, DK><<<grid, 384, T::kSmemBytes, stream>>>(args, maps);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

template <int D>
void launch_ws_head_dim(const BackwardArgs& args, int stages, bool bulk_dq, cudaStream_t stream) {
  if (bulk_dq)  // (three stages with the staging tiles spill registers at head dim 128: not offered)
    launch_ws<D, 2, true>(args, stream);
  else
    stages == 3 ? launch_ws<D, 3, false>(args, stream) : launch_ws<D, 2, false>(args, stream);
}

}  // namespace

void launch_backward_warp_specialized(const BackwardArgs& args, int stages, bool bulk_dq,
                                      cudaStream_t stream) {
  if (!warp_specialized_takes(int64_t(args.batch) * args.seq_len))
    throw std::invalid_argument("flash attention backward: the warp-specialized kernel needs b * s < 2^31");
  if (stages != 2 && stages != 3)
    throw std::invalid_argument("flash attention backward: the warp-specialized kernel takes 2 or 3 stages");
  if (bulk_dq && stages != 2)
    throw std::invalid_argument(
        "flash attention backward: the warp-specialized kernel's bulk dQ takes 2 stages");
  const int tile_dim = tile_head_dim(args.head_dim);
  if (tile_dim == 0)
    throw std::invalid_argument(
        "flash attention backward: the warp-specialized kernel takes head dim 64-128");
  if (tile_dim != args.head_dim && !bulk_dq)  // the atomics address dQ's row layout by the tile width
    throw std::invalid_argument(
        "flash attention backward: head dims 80 and 96 take the warp-specialized kernel with bulk dQ");
  if (tile_dim == 64)
    launch_ws_head_dim<64>(args, stages, bulk_dq, stream);
  else if (args.head_dim == 80)
    launch_ws<128, 2, true, 80>(args, stream);
  else if (args.head_dim == 96)
    launch_ws<128, 2, true, 96>(args, stream);
  else
    launch_ws_head_dim<128>(args, stages, bulk_dq, stream);
}

}  // namespace megatune::executor::cuda::hopper
