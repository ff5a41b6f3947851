// Tensor maps for the Hopper TMA unit (host side): the heads of a token-major bf16 activation read as
// 64-column x box_rows boxes of one head that land 128-byte swizzled in shared memory (the sw128 layout of
// wgmma.cuh). The driver's encoder is reached through the runtime, so nothing links against libcuda.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

namespace megatune::executor::cuda {

// A 3-D map (column, head, row) over [rows, heads, head_dim] bf16 with the heads of a row contiguous and
// row_stride elements between rows (data 16-byte aligned, head_dim and row_stride multiples of 8). Boxes are
// 64 columns x 1 head x box_rows rows; columns past head_dim and rows past the end read as zeros, so a head
// dim of 80 or 96 arrives as a zero-padded 128-column tile. Throws std::invalid_argument when the driver
// rejects the map.
CUtensorMap make_bf16_head_tile_map(const __nv_bfloat16* data, int64_t rows, int64_t heads, int64_t head_dim,
                                    int64_t row_stride, int box_rows);

}  // namespace megatune::executor::cuda
