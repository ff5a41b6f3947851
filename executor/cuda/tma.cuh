// Device side of the TMA pipelines (warp-specialized attention kernels): mbarrier waits and 2-D tile loads
// into the sw128 layout of wgmma.cuh (D / 64 boxes of 64 columns per tile).
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <cuda/ptx>

namespace megatune::executor::cuda::hopper {

__device__ __forceinline__ void wait_parity(uint64_t* barrier, uint32_t parity) {
  while (!::cuda::ptx::mbarrier_try_wait_parity(barrier, parity)) {
  }
}

// A kRows x D tile at (column col0, row row0) of the map into an sw128 tile, completing on barrier's
// transaction count (kRows * D * 2 bytes).
template <int kRows, int D>
__device__ __forceinline__ void tma_tile(__nv_bfloat16* smem, const CUtensorMap* map, int col0, int row0,
                                         uint64_t* barrier) {
#pragma unroll
  for (int panel = 0; panel < D / 64; ++panel) {
    const int32_t coords[2] = {col0 + 64 * panel, row0};
    ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global,
                                      smem + panel * kRows * 64, map, coords, barrier);
  }
}

}  // namespace megatune::executor::cuda::hopper
