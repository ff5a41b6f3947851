// Warp-specialized flash attention forward on Hopper (sm_90a), the forward counterpart of
// flash_attention_hopper_backward_ws.cu: a block owns 64 query rows per consumer warpgroup (two, or three for
// head dim 64) of one (batch, head). Head dims 80 and 96 run the head dim 128 kernel on tiles the TMA unit
// zero-pads to 128 columns (tile_head_dim): the scores are unchanged, O's padded columns are not stored.
// Head dim 256 streams 64-row K / V tiles (O's 64 x 256 accumulator is two m64n128 products per chunk).
// Warpgroup 0 is the producer (setmaxnreg.dec 24): one thread loads the block's Q tile and streams the K / V
// tiles (128 rows) into a 2-stage ring with the TMA unit, each stage guarded by a full and an empty mbarrier.
// The consumers (setmaxnreg.inc) compute S = Q K^T, the online softmax and O += P V exactly as
// flash_attention_hopper_forward.cu does per tile, with no load code and no block barrier: they only wait for
// a stage and release it, so they drift apart and one warpgroup's softmax overlaps another's products.
#include <cfloat>
#include <cuda/ptx>
#include <stdexcept>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/flash_attention_common.cuh"
#include "executor/cuda/flash_attention_hopper.h"
#include "executor/cuda/flash_attention_hopper_forward_tile.cuh"
#include "executor/cuda/tma.cuh"
#include "executor/cuda/tma.h"
#include "executor/cuda/wgmma.cuh"

namespace megatune::executor::cuda::hopper {
namespace {

using bf16 = __nv_bfloat16;
using flash::fast_exp2;
using flash::kLn2;

// D: the V / O tile width; DQK: the Q / K tile width (192 with D = 128 for MLA, else D).
template <int D, int kConsumers, int DQK = D>
struct WsForwardTile {
  static constexpr int kStages = 2;
  // Key rows per tile: 64 at head dim 256 (O takes 128 registers per thread; Q and two K / V stages fill
  // 192 KiB of shared memory), else 128.
  static constexpr int kBlockN = D == 256 ? 64 : 128;
  static constexpr int kBlockM = 64 * kConsumers;  // query rows per block
  static constexpr int kThreads = 128 * (kConsumers + 1);
  // Registers per thread after setmaxnreg: the producer's 24 plus the consumers' fill the 64 Ki file.
  static constexpr int kConsumerRegisters = kConsumers == 2 ? 240 : 160;
  // Byte offsets from the 1024-aligned base.
  static constexpr int kQ = 0;                                      // sw128 [kBlockM][DQK]
  static constexpr int kK = kQ + kBlockM * DQK * 2;                 // [kStages] sw128 [kBlockN][DQK]
  static constexpr int kV = kK + kStages * kBlockN * DQK * 2;       // [kStages] sw128 [kBlockN][D]
  static constexpr int kBarriers = kV + kStages * kBlockN * D * 2;  // q_full, full[kStages], empty[kStages]
  static constexpr int kSmemBytes = kBarriers + (1 + 2 * kStages) * 8 + 1024;
  static_assert(kQ % 1024 == 0 && kK % 1024 == 0 && kV % 1024 == 0, "tiles must start 1024-byte aligned");
};

struct WsForwardMaps {
  CUtensorMap q, k, v;
};

// DK: the head-dim columns of the score product (80 or 96 on tiles zero-padded to D = 128; else DQK); DQK:
// the Q / K tile width (192 for MLA's q/k with v 128; else D).
template <int D, int kConsumers, bool kPingPong, int DK = D, int DQK = D>
__global__ void __launch_bounds__(WsForwardTile<D, kConsumers, DQK>::kThreads, 1)
    flash_forward_ws_kernel(const __grid_constant__ ForwardArgs p,
                            const __grid_constant__ WsForwardMaps maps) {
  using T = WsForwardTile<D, kConsumers, DQK>;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kStages = T::kStages;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = align_1024(smem_raw);
  bf16* q_tile = reinterpret_cast<bf16*>(base + T::kQ);
  bf16* k_tiles = reinterpret_cast<bf16*>(base + T::kK);
  bf16* v_tiles = reinterpret_cast<bf16*>(base + T::kV);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(base + T::kBarriers);
  uint64_t* full = q_full + 1;
  uint64_t* empty = full + kStages;

  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest (causal) blocks first
  const int head = blockIdx.y, batch = blockIdx.z;
  const int group = head / p.heads_per_group;
  const int q0 = m_block * kBlockM;
  const int64_t batch_token0 = int64_t(batch) * p.seq_len;
  int n_blocks = (p.seq_len + kBlockN - 1) / kBlockN;
  if (p.causal) n_blocks = min(n_blocks, (q0 + kBlockM + kBlockN - 1) / kBlockN);
  const int role = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);

  if (threadIdx.x == 0) {
    ::cuda::ptx::mbarrier_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      ::cuda::ptx::mbarrier_init(full + s, 1);                // the producer thread's arrive.expect_tx
      ::cuda::ptx::mbarrier_init(empty + s, 4 * kConsumers);  // one lane per consumer warp
    }
    ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
  }
  __syncthreads();

  if (role == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x != 0) return;
    ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                           ::cuda::ptx::space_shared, q_full, uint32_t(kBlockM * DQK * 2));
    tma_tile<kBlockM, DQK>(q_tile, &maps.q, head, int(batch_token0) + q0, q_full);
    for (int j = 0; j < n_blocks; ++j) {
      const int s = j % kStages;
      if (j >= kStages) wait_parity(empty + s, ((j / kStages) & 1) ^ 1);
      ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                             ::cuda::ptx::space_shared, full + s,
                                             uint32_t(kBlockN * (DQK + D) * 2));
      tma_tile<kBlockN, DQK>(k_tiles + s * kBlockN * DQK, &maps.k, group, int(batch_token0) + j * kBlockN,
                             full + s);
      tma_tile<kBlockN, D>(v_tiles + s * kBlockN * D, &maps.v, group, int(batch_token0) + j * kBlockN,
                           full + s);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(T::kConsumerRegisters) : "memory");
  const int wg = role - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float row_max[2] = {-FLT_MAX, -FLT_MAX}, row_sum[2] = {0.0f, 0.0f};
  const int wg_row0 = q0 + 64 * wg;
  const int q_row[2] = {wg_row0 + 16 * warp + g, wg_row0 + 16 * warp + g + 8};
  const uint32_t q_address = shared_address(q_tile) + 64 * wg * 128;
  wait_parity(q_full, 0);
  // Ping-pong: the last consumer gives the first one its first turn.
  if constexpr (kPingPong) {
    if (wg == kConsumers - 1 && n_blocks > 0) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
  }

  for (int j = 0; j < n_blocks; ++j) {
    const int s = j % kStages;
    const int kv0 = j * kBlockN;
    const uint32_t k_address = shared_address(k_tiles + s * kBlockN * DQK);
    const uint64_t v_desc = mn_major_descriptor(shared_address(v_tiles + s * kBlockN * D), kBlockN * 128);
    wait_parity(full + s, (j / kStages) & 1);

    if constexpr (kPingPong) {
      // Ping-pong: the consumers take turns at S = Q K^T (named barrier 1 + w for warpgroup w: its 128
      // threads wait, its predecessor's 128 arrive), so that one warpgroup's softmax and P V run under the
      // next one's score product instead of all of them computing scores at once.
      const bool pass_on = !(wg == kConsumers - 1 && j == n_blocks - 1);  // nobody waits for that turn
      forward_tile<D, kBlockN, DK>(
          p, q_address, kBlockM, k_address, v_desc, kv0, wg_row0, q_row, t, o, row_max, row_sum,
          [&] { asm volatile("bar.sync %0, 256;\n" ::"r"(1 + wg)
                             : "memory"); },
          [&] {
            if (pass_on) asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + (wg + 1) % kConsumers) : "memory");
          });
    } else {
      forward_tile<D, kBlockN, DK>(p, q_address, kBlockM, k_address, v_desc, kv0, wg_row0, q_row, t, o,
                                   row_max, row_sum);
    }
    // This warp is done with stage s (its products have completed).
    __syncwarp();
    if (lane == 0) ::cuda::ptx::mbarrier_arrive(empty + s);
  }

  store_o_lse<D>(p, o, row_max, row_sum, q_row, batch_token0, batch, head, t);
}

template <int D, int kConsumers, bool kPingPong, int DK = D, int DQK = D>
void launch_ws(const ForwardArgs& args, cudaStream_t stream) {
  using T = WsForwardTile<D, kConsumers, DQK>;
  static bool configured = false;
  if (!configured) {
    MEGATUNE_CUDA_CHECK(cudaFuncSetAttribute(flash_forward_ws_kernel<D, kConsumers, kPingPong, DK, DQK>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
    configured = true;
  }
  const int64_t rows = int64_t(args.batch) * args.seq_len;
  const int64_t kv_heads = args.num_heads / args.heads_per_group;
  const WsForwardMaps maps{
      make_bf16_head_tile_map(args.q, rows, args.num_heads, args.head_dim, args.q_stride, T::kBlockM),
      make_bf16_head_tile_map(args.k, rows, kv_heads, args.head_dim, args.kv_stride, T::kBlockN),
      make_bf16_head_tile_map(args.v, rows, kv_heads, args.head_dim_v, args.kv_stride, T::kBlockN)};
  const dim3 grid(unsigned((args.seq_len + T::kBlockM - 1) / T::kBlockM), unsigned(args.num_heads),
                  unsigned(args.batch));
  flash_forward_ws_kernel<D, kConsumers, kPingPong, DK, DQK>
      <<<grid, T::kThreads, T::kSmemBytes, stream>>>(args, maps);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_forward_warp_specialized(const ForwardArgs& args, int consumer_warpgroups, bool ping_pong,
                                     cudaStream_t stream) {
  if (!warp_specialized_takes(int64_t(args.batch) * args.seq_len))
    throw std::invalid_argument("hopper::launch_forward_warp_specialized: needs b * s < 2^31");
  if (consumer_warpgroups != 2 && consumer_warpgroups != 3)
    throw std::invalid_argument("hopper::launch_forward_warp_specialized: 2 or 3 consumer warpgroups");
  const bool mla = args.head_dim == 192 && args.head_dim_v == 128;
  if (!mla &&
      (args.head_dim_v != args.head_dim || (tile_head_dim(args.head_dim) == 0 && args.head_dim != 256)))
    throw std::invalid_argument(
        "hopper::launch_forward_warp_specialized: head dim 64, 80, 96, 128 or 256, or 192 with v 128");
  if ((args.head_dim == 256 || mla) && ping_pong)
    throw std::invalid_argument(
        "hopper::launch_forward_warp_specialized: head dims 192, 256 have no ping-pong");
  if (args.head_dim != 64 && consumer_warpgroups == 3)
    throw std::invalid_argument(
        "hopper::launch_forward_warp_specialized: head dims 80-256 take 2 consumer warpgroups");
  if (args.head_dim == 64 && consumer_warpgroups == 3)
    ping_pong ? launch_ws<64, 3, true>(args, stream) : launch_ws<64, 3, false>(args, stream);
  else if (args.head_dim == 64)
    ping_pong ? launch_ws<64, 2, true>(args, stream) : launch_ws<64, 2, false>(args, stream);
  else if (args.head_dim == 256)
    launch_ws<256, 2, false>(args, stream);
  else if (mla)
    launch_ws<128, 2, false, 192, 192>(args, stream);
  else if (ping_pong)  // (80 and 96 with the ping-pong read all 128 padded columns: a variant, not compiled
                       // twice)
    launch_ws<128, 2, true>(args, stream);
  else if (args.head_dim == 80)
    launch_ws<128, 2, false, 80>(args, stream);
  else if (args.head_dim == 96)
    launch_ws<128, 2, false, 96>(args, stream);
  else
    launch_ws<128, 2, false>(args, stream);
}

}  // namespace megatune::executor::cuda::hopper
