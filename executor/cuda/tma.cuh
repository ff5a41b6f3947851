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

// The kRows x D tile of one head at row row0 of a make_bf16_head_tile_map map into an sw128 tile (columns
// past the map's head dim as zeros), completing on barrier's transaction count (kRows * D * 2 bytes: the
// zero-filled part counts).
template <int kRows, int D>
__device__ __forceinline__ void tma_tile(__nv_bfloat16* smem, const CUtensorMap* map, int head, int row0,
                                         uint64_t* barrier) {
#pragma unroll
  for (int panel = 0; panel < D / 64; ++panel) {
    const int32_t coords[3] = {64 * panel, head, row0};
    ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global,
                                      smem + panel * kRows * 64, map, coords, barrier);
  }
}

}  // namespace megatune::executor::cuda::hopper
