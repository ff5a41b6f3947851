// Tensor maps for the Hopper TMA unit (host side): a 2-D bf16 matrix read as 64-column x box_rows boxes that
// land 128-byte swizzled in shared memory (the sw128 layout of wgmma.cuh). The driver's encoder is reached
// through the runtime, so nothing links against libcuda.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

namespace megatune::executor::cuda {

// A map over a [rows, cols] bf16 matrix with row_stride elements between rows (data 16-byte aligned,
// row_stride a multiple of 8); rows past the end read as zeros. Throws std::invalid_argument when the driver
// rejects the map.
CUtensorMap make_bf16_tile_map(const __nv_bfloat16* data, int64_t rows, int64_t cols, int64_t row_stride,
                               int box_rows);

}  // namespace megatune::executor::cuda
