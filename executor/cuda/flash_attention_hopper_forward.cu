// Flash attention forward on Hopper tensor cores (wgmma, sm_90a): a block of one or two warpgroups owns 64
// query rows per warpgroup of one (batch, head) (one warpgroup: up to three blocks per SM that drift apart,
// two: one block per SM sharing each K/V tile); 128-row K/V tiles stream through double-buffered, 128-byte-
// swizzled shared memory (cp.async); S = Q K^T is one m64n128 wgmma chain from shared memory, the online
// softmax (base 2, fp32) runs on its accumulators, and O += P V takes P straight from registers.
#include <cfloat>
#include <stdexcept>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/flash_attention_common.cuh"
#include "executor/cuda/flash_attention_hopper.h"
#include "executor/cuda/flash_attention_hopper_forward_tile.cuh"
#include "executor/cuda/wgmma.cuh"

namespace megatune::executor::cuda::hopper {
namespace {

using bf16 = __nv_bfloat16;
using flash::fast_exp2;
using flash::kLn2;

constexpr int kBlockN = 128;  // key rows per tile

template <int D, int kWarpGroups>
struct ForwardTile {
  static constexpr int kBlockM = 64 * kWarpGroups;  // query rows per block
  static constexpr int kThreads = 128 * kWarpGroups;
  static constexpr int kSmemBytes = (kBlockM * D + 4 * kBlockN * D) * int(sizeof(bf16)) + 1024;
  // One warpgroup with head dim 64: registers and shared memory fit three blocks per SM.
  static constexpr int kMinBlocksPerSm = kWarpGroups == 1 && D == 64 ? 3 : 1;
};

template <int D, int kWarpGroups>
__global__ void __launch_bounds__(ForwardTile<D, kWarpGroups>::kThreads,
                                  ForwardTile<D, kWarpGroups>::kMinBlocksPerSm)
    flash_forward_hopper_kernel(const ForwardArgs p) {
  constexpr int kBlockM = ForwardTile<D, kWarpGroups>::kBlockM,
                kThreads = ForwardTile<D, kWarpGroups>::kThreads;
  extern __shared__ unsigned char smem_raw[];
  bf16* q_tile = reinterpret_cast<bf16*>(align_1024(smem_raw));  // sw128 [kBlockM][D]
  bf16* k_tiles = q_tile + kBlockM * D;                          // [2] sw128 [kBlockN][D]
  bf16* v_tiles = k_tiles + 2 * kBlockN * D;                     // [2] sw128 [kBlockN][D]

  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest (causal) blocks first
  const int head = blockIdx.y, batch = blockIdx.z;
  const int group = head / p.heads_per_group;
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int q0 = m_block * kBlockM;
  const int64_t batch_token0 = int64_t(batch) * p.seq_len;
  const bf16* k_base = p.k + batch_token0 * p.kv_stride + int64_t(group) * D;
  const bf16* v_base = p.v + batch_token0 * p.kv_stride + int64_t(group) * D;

  load_tile_sw128<kBlockM, D, kThreads>(q_tile, p.q + batch_token0 * p.q_stride + int64_t(head) * D,
                                        p.q_stride, q0, p.seq_len);
  int n_blocks = (p.seq_len + kBlockN - 1) / kBlockN;
  if (p.causal) n_blocks = min(n_blocks, (q0 + kBlockM + kBlockN - 1) / kBlockN);
  if (n_blocks > 0) {
    load_tile_sw128<kBlockN, D, kThreads>(k_tiles, k_base, p.kv_stride, 0, p.seq_len);
    load_tile_sw128<kBlockN, D, kThreads>(v_tiles, v_base, p.kv_stride, 0, p.seq_len);
  }
  flash::cp_async_commit();

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float row_max[2] = {-FLT_MAX, -FLT_MAX}, row_sum[2] = {0.0f, 0.0f};
  const int wg_row0 = q0 + 64 * wg;
  const int q_row[2] = {wg_row0 + 16 * warp + g, wg_row0 + 16 * warp + g + 8};
  const uint32_t q_address = shared_address(q_tile) + 64 * wg * 128;

  for (int j = 0; j < n_blocks; ++j) {
    flash::cp_async_wait<0>();
    fence_async_shared();
    __syncthreads();
    if (j + 1 < n_blocks) {
      const int buffer = (j + 1) & 1;
      load_tile_sw128<kBlockN, D, kThreads>(k_tiles + buffer * kBlockN * D, k_base, p.kv_stride,
                                            (j + 1) * kBlockN, p.seq_len);
      load_tile_sw128<kBlockN, D, kThreads>(v_tiles + buffer * kBlockN * D, v_base, p.kv_stride,
                                            (j + 1) * kBlockN, p.seq_len);
    }
    flash::cp_async_commit();
    const int kv0 = j * kBlockN;
    const uint32_t k_address = shared_address(k_tiles + (j & 1) * kBlockN * D);
    const uint32_t v_address = shared_address(v_tiles + (j & 1) * kBlockN * D);
    const uint64_t v_desc = mn_major_descriptor(v_address, kBlockN * 128);

    forward_tile<D, kBlockN>(p, q_address, kBlockM, k_address, v_desc, kv0, wg_row0, q_row, t, o, row_max,
                             row_sum);
  }

  store_o_lse<D>(p, o, row_max, row_sum, q_row, batch_token0, batch, head, t);
}

template <int D, int kWarpGroups>
void launch(const ForwardArgs& args, cudaStream_t stream) {
  using T = ForwardTile<D, kWarpGroups>;
  static bool configured = false;
  if (!configured) {
    MEGATUNE_CUDA_CHECK(cudaFuncSetAttribute(flash_forward_hopper_kernel<D, kWarpGroups>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
    configured = true;
  }
  const dim3 grid(unsigned((args.seq_len + T::kBlockM - 1) / T::kBlockM), unsigned(args.num_heads),
                  unsigned(args.batch));
  flash_forward_hopper_kernel<D, kWarpGroups><<<grid, T::kThreads, T::kSmemBytes, stream>>>(args);
  MEGATUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_forward(const ForwardArgs& args, int warpgroups_per_block, cudaStream_t stream) {
  if (warpgroups_per_block != 1 && warpgroups_per_block != 2)
    throw std::invalid_argument("hopper::launch_forward: warpgroups_per_block must be 1 or 2");
  if (args.head_dim != 64 && args.head_dim != 128)
    throw std::invalid_argument("hopper::launch_forward: head dim 64 or 128 (80, 96: warp-specialized)");
  if (args.head_dim == 64)
    warpgroups_per_block == 1 ? launch<64, 1>(args, stream) : launch<64, 2>(args, stream);
  else
    warpgroups_per_block == 1 ? launch<128, 1>(args, stream) : launch<128, 2>(args, stream);
}

}  // namespace megatune::executor::cuda::hopper
