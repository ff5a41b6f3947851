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

    // S = Q K^T (64 x 128 per warpgroup).
    float s[kBlockN / 2];
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) s[i] = 0.0f;
    wgmma_fence();
    gemm_k_major<D, kBlockN>(s, q_address, kBlockM, k_address);
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(s);

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
    // Online softmax per row (each row's 128 columns live on the 4 lanes of one quad): the row maxima and
    // the O rescale first, then per 16 key columns P = exp2(S - m) and that chunk's O += P V issued at once,
    // so the tensor cores work on chunk kk while the next chunk's exponentials run.
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
      if constexpr (D == 128)
        wgmma_rs_m64n128<1>(o, pa[kk], b, 1);
      else
        wgmma_rs_m64n64<1>(o, pa[kk], b, 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_registers(o);
    fence_registers(pa);
  }

  // O /= l; lse = (m + log2 l) ln 2.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int row = q_row[r];
    if (row >= p.seq_len) continue;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    bf16* o_row = p.o + (batch_token0 + row) * p.o_stride + int64_t(head) * D;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      *reinterpret_cast<__nv_bfloat162*>(o_row + 8 * i + 2 * t) =
          __floats2bfloat162_rn(o[4 * i + 2 * r] * inv, o[4 * i + 2 * r + 1] * inv);
    }
    if (t == 0)
      p.lse[(int64_t(batch) * p.num_heads + head) * p.seq_len + row] = (row_max[r] + log2f(sum)) * kLn2;
  }
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
  if (args.head_dim == 64)
    warpgroups_per_block == 1 ? launch<64, 1>(args, stream) : launch<64, 2>(args, stream);
  else
    warpgroups_per_block == 1 ? launch<128, 1>(args, stream) : launch<128, 2>(args, stream);
}

}  // namespace megatune::executor::cuda::hopper
